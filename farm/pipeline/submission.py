"""What a submission asks for, validated, and what an embedded build reports back.

Kept apart from ``farm.pipeline.plan`` (which imports SQLAlchemy and the ORM models) so that the
CLI's fast paths (``farm.pipeline.cached``, ``farm resolve``) validate their input with the very
same functions, and fail with the very same errors, without paying for those imports.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.core.catalog import Target, parse_target
from farm.core.errors import NoWorkerError, UnsupportedOpsError, UsageError
from farm.core.names import DEFAULT_TAG, check_name, check_tag

Progress = Callable[[str, str, dict[str, Any]], None]  # (event, target ref, info)


def no_progress(_event: str, _target: str, _info: dict[str, Any]) -> None:
    """The progress callback of a caller that shows none."""
    return None


# 2.51.0, 10.14.1.48, and TensorRT toolchains with their platform: 10.14.1.48+linux-x86-64
VERSION_RE = re.compile(r"\d+(\.\d+){1,3}(\+[a-z0-9][a-z0-9-]{0,40})?")


@dataclass
class BuildOutcome:
    target: str
    toolchain: str
    state: str  # built | cached | failed
    build_id: int
    artifact: str | None = None  # manifest digest
    compile_seconds: float | None = None
    wall_seconds: float | None = None
    size: int | None = None
    nodes_ep: int | None = None
    nodes_cpu: int | None = None
    # The op types left on the CPU (partial offload; the index's, None where not recorded).
    cpu_op_types: list[str] | None = None
    error_code: str | None = None
    error_message: str | None = None
    cached_failure: bool = False
    accuracy: dict[str, Any] | None = None  # registry.evidence.view, when checked (--min-psnr, --accuracy)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class BuildReport:
    model_digest: str
    name: str
    tag: str | None
    outcomes: list[BuildOutcome] = field(default_factory=list)
    tag_moved: dict[str, str] | None = None  # {"tag", "from", "to"} when --force-tag moved NAME:TAG

    @property
    def ok(self) -> bool:
        return all(o.state != "failed" for o in self.outcomes)


# ---- validation shared by every front door ----------------------------------------------------------

def check_name_tag(name: str | None, tag: str | None) -> tuple[str | None, str | None]:
    if tag is not None and name is None:
        raise UsageError("--tag needs --name", hint="e.g. --name vision/super-res --tag stable")
    if name is None:
        return None, None
    return check_name(name), check_tag(DEFAULT_TAG if tag is None else tag)


def check_versions(versions: Sequence[str]) -> list[str]:
    for v in versions:
        if not isinstance(v, str) or not VERSION_RE.fullmatch(v):
            raise UsageError(f"{str(v)[:40]!r} is not a toolchain version like 2.51.0")
    return list(dict.fromkeys(versions))


def parse_targets(target_refs: Sequence[str]) -> list[Target]:
    if not target_refs:
        raise UsageError("no target given", hint="add --target qnn:SM8650 (see `farm targets`)")
    targets: list[Target] = []
    for ref in target_refs:
        t = parse_target(ref)
        if t not in targets:
            targets.append(t)
    return targets



@dataclass(frozen=True)
class BuildRequest:
    """A validated ``farm build`` request: the one parse the fast cached path and the full
    pipeline share, so both refuse the same input the same way."""

    name: str | None
    tag: str | None
    targets: list[Target]
    options: dict[Target, dict[str, Any]]  # normalized per target
    gated: bool  # --require-full-offload


def parse_build_request(target_refs: Sequence[str], option_pairs: Sequence[str], name: str | None,
                        tag: str | None, require_full_offload: bool) -> BuildRequest:
    from farm.core.options import normalize, parse_pairs, split_gate

    name, tag = check_name_tag(name, tag)
    targets = parse_targets(target_refs)
    raw, gated = split_gate(parse_pairs(option_pairs))
    return BuildRequest(name, tag, targets, {t: normalize(t.backend, raw, t) for t in targets},
                        gated or require_full_offload)

# ---- the full-offload gate -------------------------------------------------------------------------
# ``--require-full-offload`` is not a compile input (the same bytes either way, measured): the build
# runs ungated and publishes its artifact under the ungated key; each answer to a gated request
# (embedded build, cached path, release status) fails the targets whose artifact left nodes on the
# CPU. A gated request after a plain one compiles nothing, and the reverse is answered cached.

def offload_refusal(nodes_cpu: int | None, artifact: str | None,
                    cpu_op_types: Callable[[], Sequence[str]]) -> UnsupportedOpsError | None:
    """The unsupported-ops error a gated request answers for an artifact with ``nodes_cpu`` CPU
    nodes, or None when it is fully offloaded. ``cpu_op_types`` reads the op types (from the
    manifest's placement) only when they are needed."""
    if not nodes_cpu or artifact is None:
        return None
    ops = ", ".join(cpu_op_types()) or "op types not recorded"
    short = artifact.removeprefix("sha256:")[:12]
    return UnsupportedOpsError(
        f"{nodes_cpu} node(s) stay on the CPU ({ops}) and full offload is required",
        hint=f"drop --require-full-offload to use the partially offloaded artifact {short} "
             f"(built and published), or replace these ops")


def gate_outcome(outcome: BuildOutcome, cpu_op_types: Callable[[], Sequence[str]]) -> BuildOutcome:
    """A built or cached outcome as a gated request sees it: failed with unsupported-ops when its
    artifact left CPU nodes (the artifact and its placement stay in the outcome)."""
    if outcome.state == "failed":
        return outcome
    refusal = offload_refusal(outcome.nodes_cpu, outcome.artifact, cpu_op_types)
    if refusal is None:
        return outcome
    outcome.cached_failure = outcome.state == "cached"
    outcome.state, outcome.error_code, outcome.error_message = "failed", refusal.code, refusal.message
    return outcome


def build_view_of(b: Any, artifact: str | None, compile_seconds: float | None, note: str | None = None,
                  nodes_cpu: int | None = None, cpu_op_types: list[str] | None = None) -> dict[str, Any]:
    """One build of a release as status shows it, from a build row (the ORM's or the fast path's
    plain one: both have these fields) and its artifact's digest, compile time and placement
    (``nodes_cpu`` > 0: a partial offload, whose ``cpu_op_types`` stay on the device's CPU)."""
    return {"build": b.id, "target": f"{b.backend}:{b.target}", "toolchain": b.toolchain, "state": b.state,
            "note": note, "attempts": b.attempts, "error_code": b.error_code, "error_message": b.error_message,
            "artifact": artifact, "compile_seconds": compile_seconds, "worker": b.worker,
            "nodes_cpu": nodes_cpu, "cpu_op_types": cpu_op_types}


def gate_view(view: dict[str, Any], nodes_cpu: int | None, cpu_op_types: Callable[[], Sequence[str]]
              ) -> dict[str, Any]:
    """A release's build (``plan.build_view``) as a --require-full-offload release sees it: a
    succeeded build whose artifact left ``nodes_cpu`` nodes on the CPU is failed with
    unsupported-ops; the build row and its artifact stay as they are."""
    if view["state"] != "succeeded":
        return view
    refusal = offload_refusal(nodes_cpu, view["artifact"], cpu_op_types)
    if refusal is None:
        return view
    return {**view, "state": "failed", "error_code": refusal.code, "error_message": refusal.message,
            "note": f"built with {nodes_cpu} node(s) on the CPU; this release requires full offload"}


# ---- releases (cluster): the request and its status, for the full path and the CLI's fast one ----

FINAL_STATES = ("succeeded", "failed")  # farm.pipeline.states.FINAL, without its SQLAlchemy import


@dataclass
class ReleaseStatus:
    release_id: int
    model: str
    builds: list[dict[str, Any]] = field(default_factory=list)
    tag_moved: dict[str, str] | None = None  # {"tag", "from", "to"} when --force-tag moved NAME:TAG
    warnings: list[str] = field(default_factory=list)  # e.g. an SDK left out of an LLM release

    @property
    def done(self) -> bool:
        return all(b["state"] in FINAL_STATES for b in self.builds)

    @property
    def ok(self) -> bool:
        return all(b["state"] == "succeeded" for b in self.builds)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.builds:
            out[b["state"]] = out.get(b["state"], 0) + 1
        return out


def _min_psnr(value: float | None) -> float | None:
    """--min-psnr, checked here too (the fast paths import no pipeline module)."""
    import math

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= 200:
        raise UsageError(f"--min-psnr {value!r} is not a number of dB from 0 to 200",
                         hint="e.g. --min-psnr 30 (fp16 rounding of a well-scaled model gives 60-80 dB)")
    return float(value)


def expand_matrix(targets: list[Target], sdks: Sequence[str], served: dict[tuple[str, str], list[str]]
                  ) -> list[tuple[Target, str]]:
    pairs: list[tuple[Target, str]] = []
    for t in targets:
        versions = list(sdks) or sorted(v for (b, v) in served if b == t.backend)
        if not versions:
            raise NoWorkerError(f"no --sdk given and no live {t.backend} worker to take one from",
                                hint="start workers (infra/farm-up.sh) or pass --sdk 2.51.0 --allow-queue")
        pairs.extend((t, v) for v in versions)
    return pairs


@dataclass
class ReleaseRequest:
    """A release matrix, validated: the same for the CLI and the HTTP service."""

    targets: list[Target]
    sdks: list[str]
    raw_options: dict[str, str]
    options: dict[Target, dict[str, Any]]
    name: str | None = None
    tag: str | None = None
    allow_queue: bool = False
    retry_failed: bool = False
    force_tag: bool = False  # NAME:TAG may move from another model to this one
    # A gate on the answer, not a build input (kept in the release's matrix; see _gate_view).
    require_full_offload: bool = False
    # --min-psnr: the accuracy gate (farm.pipeline.accuracy.release_gate_view), in the matrix too.
    min_psnr: float | None = None

    @classmethod
    def parse(cls, target_refs: Sequence[str], sdks: Sequence[str], raw_options: dict[str, str],
              name: str | None = None, tag: str | None = None, allow_queue: bool = False,
              retry_failed: bool = False, force_tag: bool = False,
              require_full_offload: bool = False, min_psnr: float | None = None) -> ReleaseRequest:
        """``require_full_offload=true`` among ``raw_options`` (the old spelling) is the gate."""
        from farm.core.options import normalize, split_gate

        name, tag = check_name_tag(name, tag)
        targets = parse_targets(target_refs)
        raw, gated = split_gate(raw_options)
        return cls(targets, check_versions(sdks), raw, {t: normalize(t.backend, raw, t) for t in targets}, name,
                   tag, allow_queue, retry_failed, force_tag, gated or require_full_offload,
                   _min_psnr(min_psnr))

    def matrix(self, served: dict[tuple[str, str], list[str]]) -> list[tuple[Target, str]]:
        return expand_matrix(self.targets, self.sdks, served)

    def check_served(self, served: dict[tuple[str, str], list[str]]) -> None:
        unserved = sorted({(t.backend, v) for t, v in self.matrix(served) if (t.backend, v) not in served})
        if unserved and not self.allow_queue:
            have = ", ".join(f"{b} {v}" for b, v in sorted(served)) or "none"
            raise NoWorkerError(
                "no live worker serves " + ", ".join(f"{b} {v}" for b, v in unserved),
                hint=f"served now: {have}. Start such a worker, or pass --allow-queue to queue and wait",
                details={"served": [f"{b}:{v}" for b, v in sorted(served)]})
