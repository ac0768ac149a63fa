"""Which artifact should a device load? Compatibility rules, candidate ordering, explained misses.

A multi-SoC build (target ``SM8650+SM8750``) serves each SoC it lists, but a per-SoC build of the
same model comes first: it was compiled for exactly that SoC, and the simulator here can load
and probe it, while a multi-SoC context can only be examined (QNN System API), not loaded.

Order: exact target -> loads (evidence beats rule) -> newest toolchain the runtime can load ->
default options -> newest build. A miss raises NoMatchError naming the nearest candidates and
what would make them match.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from farm.core.catalog import Target, load_catalog
from farm.core.errors import NoMatchError
from farm.core.keys import options_digest, parse_version
from farm.core.options import normalize
from farm.core.times import human, iso
from registry.lite import Rows, rows_of
from registry.reads import Candidate, files_and_signatures
from registry.reads import candidates as _candidates

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    # The rules and the ranking read attributes only: a Candidate, or an ORM Artifact (tests).
    Artifact = Any


@dataclass(frozen=True)
class Verdict:
    """Whether an artifact loads on a device, and what says so: a ``rule`` (versions, SoC) or a
    ``probe`` (it was loaded under exactly this runtime version, at ``recorded_at``)."""

    loads: bool
    source: str  # rule | probe | device (reports from devices: registry.reports)
    reason: str
    recorded_at: datetime | None = None
    # Why no runtime here can load it (weight-shared group, multi-SoC binary): served by the
    # rule, never claimed to load (the answer's ``unverified``).
    unverified: str | None = None

    def explain(self) -> str:
        """``picked by probe: loaded under QNN 2.51.0 on 2026-11-22 07:07 UTC``"""
        return f"picked by {self.source}: {self.reason}"


@dataclass(frozen=True)
class Device:
    backend: str
    target: Target
    runtime: str  # QNN SDK version of the device runtime, or TensorRT version


def qnn_rule(artifact: Artifact, device: Device) -> Verdict:
    """QNN: same SoC (or a multi-SoC build listing it), and the runtime SDK is at least the SDK
    that built the context (measured)."""
    covers = artifact.target.split("+")
    if artifact.target != device.target.name and device.target.name in covers:
        if parse_version(artifact.toolchain) > parse_version(device.runtime):
            return Verdict(False, "rule",
                           f"built with QNN {artifact.toolchain}, newer than the runtime {device.runtime}")
        return Verdict(True, "rule", f"multi-SoC build for {', '.join(covers)} covers {device.target.name}, "
                                     f"built with QNN {artifact.toolchain} <= runtime {device.runtime} "
                                     f"(unverified here: {UNVERIFIED_MULTI_SOC})", unverified=UNVERIFIED_MULTI_SOC)
    if artifact.target != device.target.name:
        built = _qnn_target(artifact.target)
        if (built.htp_arch_number or 0) > (device.target.htp_arch_number or 0):
            why = f"built for {built.name} ({built.htp_arch}), a newer HTP arch than {device.target.htp_arch}"
        else:
            why = f"built for {built.name} ({built.htp_arch}), not {device.target.name} ({device.target.htp_arch})"
        return Verdict(False, "rule", why)
    if parse_version(artifact.toolchain) > parse_version(device.runtime):
        return Verdict(False, "rule", f"built with QNN {artifact.toolchain}, newer than the runtime {device.runtime}")
    # A graph group's first context model is g0_ctx.onnx (fixed stems, farm.core.groups); a
    # genai package's is its genai_config.json (farm.pipeline.genai): its parts are groups.
    shared = SHARED_KINDS.get(getattr(artifact, "ctx_model", ""))
    if shared:
        return Verdict(True, "rule", f"same SoC, built with QNN {artifact.toolchain} <= runtime {device.runtime} "
                                     f"({shared}, unverified here: {UNVERIFIED_SHARED})",
                       unverified=UNVERIFIED_SHARED)
    return Verdict(True, "rule", f"same SoC, built with QNN {artifact.toolchain} <= runtime {device.runtime}")


UNVERIFIED_SHARED = "the x86_64 simulator cannot load weight-shared contexts"
SHARED_KINDS = {"g0_ctx.onnx": "a weight-shared graph group",
                "genai_config.json": "a genai package of weight-shared parts"}
UNVERIFIED_MULTI_SOC = "the x86_64 simulator cannot load multi-SoC contexts"


@lru_cache(maxsize=256)
def _qnn_target(name: str) -> Target:
    return load_catalog().get(name, backend="qnn")


def trt_rule(artifact: Artifact, device: Device) -> Verdict:
    """TensorRT: the same TensorRT major.minor.patch.build and the same OS/CPU platform (the
    toolchain is ``10.14.1.48+linux-x86-64``; NVIDIA promises engine reuse only then); the same
    compute capability, unless the engine was built hardware-compatible (Ampere+, sm_80 and newer).
    "Same sm" is NVIDIA's promise only under kSAME_COMPUTE_CAPABILITY, which the EP does not
    expose: it stays a rule, and a probe on a GPU of the device's kind overrides it."""
    built_trt, _, built_platform = artifact.toolchain.partition("+")
    run_trt, _, run_platform = device.runtime.partition("+")
    if parse_version(built_trt) != parse_version(run_trt):
        return Verdict(False, "rule", f"built with TensorRT {built_trt}; runtime {run_trt} "
                                      "(engines are tied to the full TensorRT version, major.minor.patch.build)")
    if built_platform and run_platform and built_platform != run_platform:
        return Verdict(False, "rule", f"built on {built_platform}, the device is {run_platform} "
                                      "(engines do not move across platforms)")
    options = artifact.build.options if artifact.build is not None else {}
    device_cc = float(device.target.compute_capability or 0)
    if options.get("hardware_compatibility_level") == "ampere_plus":
        if device_cc >= 8.0:
            return Verdict(True, "rule", f"hardware-compatible (Ampere+) engine, {device.target.name} is sm_80+")
        return Verdict(False, "rule", f"hardware-compatible engines need sm_80+, not {device.target.name}")
    if artifact.target != device.target.name:
        return Verdict(False, "rule", f"built for {artifact.target}, not {device.target.name}")
    return Verdict(True, "rule", f"same GPU arch {artifact.target}, TensorRT {artifact.toolchain}")


RULES = {"qnn": qnn_rule, "trt": trt_rule}
RUNTIME_NAMES = {"qnn": "QNN", "trt": "TensorRT"}


def verdict(artifact: Artifact, device: Device) -> Verdict:
    return RULES[device.backend](artifact, device)


@lru_cache(maxsize=256)
def _default_options_digest(backend: str, target: Target) -> str:
    return options_digest(normalize(backend, {}, target))


def candidates(session: Session | Rows, model_digest: str, device: Device, target: str | None = None
               ) -> list[Candidate]:
    """Active artifacts of a model for the device's backend (one target's only, when given), each
    with its build's options (TRT rules read them) and the probe verdict for the device's
    runtime: one statement (``registry.reads.candidates``). Files are read for the winner only."""
    return _candidates(rows_of(session), model_digest, device.backend, device.runtime, target)


def _probes(arts: list[Candidate], device: Device) -> dict[tuple[int, str], Any]:
    return {(a.id, device.runtime): a.probe for a in arts if a.probe is not None}


# What picked an artifact, strongest first: devices that loaded it (reports), a probe here, the rules.
SOURCE_RANK = {"device": 2, "probe": 1, "rule": 0}
FAIL_DEVICES = 3  # default of FARM_REPORT_FAIL_DEVICES


def rank(arts: list[Artifact], device: Device, probes: dict[tuple[int, str], Any] | None = None,
         devices: dict[int, Any] | None = None, fail_devices: int = FAIL_DEVICES,
         ) -> tuple[list[tuple[Artifact, Verdict]], list[tuple[Artifact, Verdict]]]:
    """(loadable best-first, not loadable nearest-first). Device reports for exactly this runtime
    version and SoC (``devices``: ``registry.reports.DeviceEvidence`` by artifact id) beat a probe,
    a probe beats the rule: an artifact devices loaded is ``device``-verified; one that failed on
    ``fail_devices`` distinct devices and loaded on none is not served; either only once the
    evidence comes from ``registry.reports.MIN_TOKENS`` distinct tokens, and only where the rule
    serves it (devices refine the rule, never override it). A different SoC is never served,
    whatever a probe or report said."""
    default_opts = _default_options_digest(device.backend, device.target)
    probes = probes or {}
    devices = devices or {}
    judged = []
    for a in arts:
        v = rule = verdict(a, device)
        probe = probes.get((a.id, device.runtime))
        if probe is not None and a.target == device.target.name:
            what = "loaded" if probe.verdict == "loads" else "failed to load"
            when = f" on {human(probe.recorded_at)}" if probe.recorded_at else ""
            v = Verdict(probe.verdict == "loads", "probe",
                        f"{what} under {RUNTIME_NAMES[device.backend]} {device.runtime}{when}"
                        + (f" ({probe.detail})" if probe.detail and probe.verdict == "fails" else ""),
                        probe.recorded_at)
        dev = devices.get(a.id)
        # Devices refine the rule, never override it: evidence counts only where the rule serves
        # this artifact to this device (same SoC or a multi-SoC build naming it, runtime new enough).
        if dev is not None and device.target.name in a.target.split("+") and rule.loads:
            v = _device_verdict(dev, device, fail_devices) or v
        judged.append((a, v))
    good = [(a, v) for a, v in judged if v.loads]
    bad = [(a, v) for a, v in judged if not v.loads]
    good.sort(key=lambda av: (
        av[0].target == device.target.name,
        SOURCE_RANK.get(av[1].source, 0),
        parse_version(av[0].toolchain),
        av[0].options_digest == default_opts,
        av[0].created_at,
    ), reverse=True)
    bad.sort(key=lambda av: (av[0].target == device.target.name, parse_version(av[0].toolchain)), reverse=True)
    return good, bad


def _device_verdict(dev: Any, device: Device, fail_devices: int) -> Verdict | None:
    """What independent device evidence says (``registry.reports.independent``: at least
    ``MIN_TOKENS`` distinct report tokens), or None: one token alone changes nothing."""
    from farm.core.text import printable
    from registry.reports import independent

    runtime = f"{RUNTIME_NAMES[device.backend]} {device.runtime}"
    said = independent(dev, fail_devices)
    if said == "loads":
        failed = f"; {dev.fails} failed" if dev.fails else ""
        return Verdict(True, "device", f"loaded on {dev.loads} device(s) ({dev.load_tokens} report tokens) with "
                       f"{device.target.name} and {runtime}{failed}", dev.last_at)
    if said == "fails":
        why = f": {printable(dev.last_error.strip().splitlines()[0][:200])}" if (dev.last_error or "").strip() else ""
        return Verdict(False, "device", f"failed on {dev.fails} device(s) ({dev.fail_tokens} report tokens) with "
                       f"{device.target.name} and {runtime}, loaded on none independently{why}", dev.last_at)
    return None


def _devices(rows: Rows, arts: list[Candidate], device: Device) -> dict[int, Any]:
    from registry.reports import device_verdicts

    # Only where a device reported anything (``Candidate.reported``): most artifacts have no reports.
    ids = [a.id for a in arts if getattr(a, "reported", True)]
    return device_verdicts(rows, ids, device.backend, device.runtime, device.target.name) if ids else {}


NEAREST = 5  # candidates a miss names


def resolve(session: Session | Rows, model_digest: str, device: Device, *, model_label: str = "",
            fail_devices: int = FAIL_DEVICES, prefer_fastest: bool = False) -> tuple[Candidate, Verdict]:
    """The artifact ``device`` should load, with the verdict that chose it; NoMatchError naming
    the nearest candidates otherwise. ``session``: a SQLAlchemy session (the service) or a bare
    connection (``registry.lite``, the CLI); the same statements run on either. A hit is two
    statements: the candidates with their probe verdicts, then the winner's files (a third where
    the device lab reported on a candidate: ``_lab``). ``prefer_fastest``
    (FARM_RESOLVE_PREFER_FASTEST): among what the rule serves, what enrolled devices measured
    fastest (``_lab``)."""
    rows = rows_of(session)
    if device.backend == "qnn":
        # The QNN rule never serves another SoC: look at this one first, the rest only to explain a miss.
        arts = candidates(rows, model_digest, device, device.target.name)
        good, bad = rank(arts, device, _probes(arts, device), _devices(rows, arts, device), fail_devices)
        if good:
            return _with_files(rows, _lab(rows, good, device, prefer_fastest))
        # The nearest sort this SoC's own first, and all it needs says what this SoC lacks: with
        # enough of them, the other targets' artifacts are only counted (``total``), not read.
        if sum(a.target == device.target.name for a, _ in bad) >= NEAREST and arts[0].total is not None:
            _miss(model_label or model_digest, device, arts[0].total, bad)
    arts = candidates(rows, model_digest, device)
    good, bad = rank(arts, device, _probes(arts, device), _devices(rows, arts, device), fail_devices)
    if good:
        return _with_files(rows, _lab(rows, good, device, prefer_fastest))
    _miss(model_label or model_digest, device, len(arts), bad)
    raise AssertionError("unreachable")


def _lab(rows: Rows, good: list[tuple[Candidate, Verdict]], device: Device, prefer_fastest: bool
         ) -> tuple[Candidate, Verdict]:
    """The winner, with what enrolled devices of the device lab confirmed of it (``lab``: one
    statement, only where a report names a candidate). ``prefer_fastest``: the candidate that
    enrolled devices of this SoC confirmed (ok on at least one, failed on none) with the lowest
    median p50, when it is not the rule's pick already (``preferred`` says so); only among
    ``good`` (what the ranking serves) and only where the compatibility rule itself serves it: a
    measurement never serves what the rule would not. Ties keep the ranking's order."""
    choice = good[0]
    ids = {a.id: a.target for a, _ in (good if prefer_fastest else good[:1]) if getattr(a, "lab_reported", False)}
    if not ids:
        return choice
    from registry.lab import of_artifacts

    lab = of_artifacts(rows, ids)

    def measured(a: Candidate) -> Any:
        return next((c for c in lab.get(a.id, []) if c.soc == device.target.name), None)

    if prefer_fastest:
        fastest: tuple[Candidate, Verdict, Any] | None = None
        for a, v in good:
            cell = measured(a)
            if cell is None or not cell.confirmed or cell.p50_ms is None or not verdict(a, device).loads:
                continue
            if fastest is None or cell.p50_ms < fastest[2].p50_ms:
                fastest = (a, v, cell)
        if fastest is not None and fastest[0].id != choice[0].id:
            over = measured(choice[0])
            fastest[0].preferred = {"by": "device-latency", "p50_ms": fastest[2].p50_ms, "devices": fastest[2].devices,
                                    "over": choice[0].digest, "over_toolchain": choice[0].toolchain,
                                    "over_p50_ms": over.p50_ms if over is not None and over.devices else None}
            choice = (fastest[0], fastest[1])
    cells = lab.get(choice[0].id)
    if cells:
        choice[0].lab = [c.to_dict() for c in cells]
    return choice


def _miss(label: str, device: Device, total: int, bad: list[tuple[Artifact, Verdict]]) -> None:
    """Raise the explained miss: ``total`` artifacts of the model for the backend, none loads;
    ``bad``, nearest first. The hint says what is needed, never a command: a device reads it
    (through the service or its own `farm fetch`), and only the farm's operators can build."""
    nearest = [{"artifact": a.digest, "target": a.target, "toolchain": a.toolchain, "reason": v.reason}
               for a, v in bad[:NEAREST]]
    if not total:
        msg = f"no {device.backend} artifact of {label} exists"
        hint = f"needed: a build of it for {device.target.ref}"
    else:
        msg = (f"none of the {total} {device.backend} artifact(s) of {label} loads on "
               f"{device.target.ref} with runtime {device.runtime}")
        lines = [f"{a.short_id} {a.target} {device.backend.upper()} {a.toolchain}: "
                 f"{'probe: ' if v.source == 'probe' else ''}{v.reason}" for a, v in bad[:NEAREST]]
        needed = _what_is_needed(bad, device)
        hint = "nearest: " + "; ".join(lines) + (f". {needed}" if needed else "")
    raise NoMatchError(msg, hint=hint, details={"nearest": nearest})


def _with_files(rows: Rows, choice: tuple[Candidate, Verdict]) -> tuple[Candidate, Verdict]:
    # The winner's files and signatures in one round trip (the service answers with both).
    choice[0].files, choice[0].signatures = files_and_signatures(rows, choice[0].id, choice[0].digest)
    if choice[0].ctx_model == "genai_config.json":  # a genai package: its twin's figures go in the answer
        from registry.reads import artifact_description

        choice[0].description = artifact_description(rows, choice[0].id)
    return choice


def _what_is_needed(bad: list[tuple[Artifact, Verdict]], device: Device) -> str:
    same = [a for a, _ in bad if a.target == device.target.name]
    if device.backend == "trt":
        return (f"needed: a build for {device.target.ref} with TensorRT {device.runtime} "
                f"(a TRT {device.runtime} worker on a {device.target.name} GPU), or a hardware-compatible one")
    withheld = [a for a, v in bad if v.source == "device" and a.target == device.target.name]
    if withheld and len(withheld) == len(same):
        # Not a version problem: a newer runtime would not help the device that has one already.
        return (f"needed: a build that loads on {device.target.name} with QNN {device.runtime} (devices reported these "
                "failing: the farm's quarantined reports say why, and its operators lift them if they were wrong)")
    too_new = [a for a in same if parse_version(a.toolchain) > parse_version(device.runtime)]
    if too_new and device.backend == "qnn":
        oldest = min(too_new, key=lambda a: parse_version(a.toolchain))
        return (f"needed: a build for {device.target.name} with QNN <= {device.runtime} "
                f"(built on a QNN {device.runtime} worker), "
                f"or a device runtime >= {oldest.toolchain}")
    if same and device.backend == "qnn":
        return f"needed: a build for {device.target.name} with QNN <= {device.runtime}"
    return f"needed: a build for {device.target.ref}"


def describe(artifact: Artifact, v: Verdict) -> dict[str, Any]:
    """The answer as JSON: which artifact, and what picked it (``source`` rule or probe, the
    ``reason`` without the source, ``probed_at`` ISO 8601 UTC for a probe, else null), how much of
    it the EP took (``offload``) and the EP's own compatibility string (``compatibility``)."""
    return {"artifact": artifact.digest, "backend": artifact.backend, "target": artifact.target,
            "toolchain": artifact.toolchain,
            "verdict": ("unverified" if v.unverified else "loads") if v.loads else "fails", "source": v.source,
            "reason": v.reason, "probed_at": iso(v.recorded_at),
            **({"unverified": v.unverified} if v.unverified else {}),
            "offload": offload(getattr(artifact, "nodes_ep", None), getattr(artifact, "nodes_cpu", None),
                               getattr(artifact, "cpu_op_types", None)),
            "compatibility": dict(getattr(artifact, "compatibility", None) or {}), **_twin(artifact),
            # Only where the device lab reported on it, or speed picked it: other answers stay as they were.
            **({"device_lab": artifact.lab} if getattr(artifact, "lab", None) else {}),
            **({"preferred": artifact.preferred} if getattr(artifact, "preferred", None) else {})}


def offload(nodes_ep: int | None, nodes_cpu: int | None, cpu_op_types: list[str] | None) -> dict[str, Any]:
    """``{"full": false, "ep_nodes": 1, "cpu_nodes": 1, "cpu_op_types": ["Gemm"]}``: whether the EP
    took the whole model, else how many nodes stay on the device's CPU and their op types
    (``cpu_op_types`` null where the artifact predates their recording: its manifest's placement
    says). ``full`` is null where the counts are unknown."""
    return {"full": None if nodes_cpu is None else nodes_cpu == 0, "ep_nodes": nodes_ep, "cpu_nodes": nodes_cpu,
            "cpu_op_types": None if cpu_op_types is None else list(cpu_op_types)}


def admit(ref: Any, soc: Any, runtime: str, arch: str) -> None:
    """Refuse a report that can't be device evidence for ``ref``: from a host the farm could be
    (``not-device-evidence``), for an SoC the artifact does not cover (``report-soc-mismatch``), or
    from a runtime the compatibility rule refuses for that build (``report-runtime-mismatch``):
    device evidence refines the rule, never overrides it. ``soc``: the catalog Target."""
    from types import SimpleNamespace

    from farm.core.errors import NotDeviceEvidenceError, ReportRuntimeMismatchError, ReportSocMismatchError
    from registry.reports import is_farm_host

    if is_farm_host(ref.backend, arch):
        raise NotDeviceEvidenceError(
            f"a {RUNTIME_NAMES.get(ref.backend, ref.backend)} runtime on {arch} is the HTP simulator, a host the farm "
            "itself could be: not device evidence")
    covers = ref.target.split("+") if ref.backend == "qnn" else [ref.target]
    hardware_compatible = ref.backend == "trt" and ref.options.get("hardware_compatibility_level") == "ampere_plus"
    if soc.name not in covers and not hardware_compatible:
        raise ReportSocMismatchError(f"artifact built for {ref.target}; the report names {soc.name}")
    art = SimpleNamespace(target=ref.target, toolchain=ref.toolchain, ctx_model=ref.ctx_model,
                          build=SimpleNamespace(options=ref.options))
    v = verdict(art, Device(ref.backend, soc, runtime))
    if not v.loads:
        if ref.backend == "trt" and soc.name not in covers:
            raise ReportSocMismatchError(f"artifact built for {ref.target}; the report names {soc.name}: {v.reason}")
        raise ReportRuntimeMismatchError(f"the compatibility rule refuses runtime {runtime} for this build: "
                                         f"{v.reason}")


def _twin(artifact: Any) -> dict[str, Any]:
    """A genai package's twin figures (farm.pipeline.genai: the parts compiled without sharing,
    generated from on the simulator against the CPU EP), as resolve's ``twin`` key."""
    desc = getattr(artifact, "description", None)
    tw = desc.get("twin") if isinstance(desc, dict) else None
    return {"twin": tw} if isinstance(tw, dict) else {}
