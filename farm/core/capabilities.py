"""What a toolchain's environment can make besides context binaries, and what a release makes of it.

A worker announces, when it registers, what its environment actually holds (``workers.capabilities``
probes it in a child: onnxruntime_genai imported and the QNN EP registered with it, onnxruntime's
``ModelPackage`` API present). This module is the vocabulary and the decisions made from those facts,
as data (no I/O): which capabilities a probe gives (``from_probe``), and which SDKs an LLM release
fans out to (``genai_matrix``): an SDK whose workers can't make the package is left out with one
warning before anything compiles, or refused when the user named it.

    genai-package        assemble an onnxruntime-genai folder from its parts (needs the folder check)
    genai-folder-check   open the folder as a device would (og.Config, each binary's graphs)
    genai-twin           generate through onnxruntime-genai on the simulator against the CPU EP
    ort-model-package    write and check an ORT model package (onnxruntime.ModelPackage, >= 1.32)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.core.errors import CapabilityMissingError

GENAI_PACKAGE = "genai-package"
GENAI_FOLDER_CHECK = "genai-folder-check"
GENAI_TWIN = "genai-twin"
ORT_MODEL_PACKAGE = "ort-model-package"
ALL = (GENAI_PACKAGE, GENAI_FOLDER_CHECK, GENAI_TWIN, ORT_MODEL_PACKAGE)
SHORT = {GENAI_PACKAGE: "genai", GENAI_FOLDER_CHECK: "folder-check", GENAI_TWIN: "twin",
         ORT_MODEL_PACKAGE: "ort-package"}

# onnxruntime-genai 0.18 is what the folder check and the twin were measured with (QNN plugin EP
# registration, decoder-pipeline configs). 0.12.2, the newest that installs beside onnxruntime
# 1.24.4 (QNN 2.47.0), imports and parses the config but answers "QNN execution provider is not
# supported in this build" when the twin opens the model (measured, docs/shipping-llm.md).
GENAI_MIN = (0, 18)
ORT_PACKAGE_MIN = (1, 32)  # onnxruntime.ModelPackage / ModelPackageContext


def _version(text: Any) -> tuple[int, ...]:
    out = []
    for part in str(text or "").split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


@dataclass(frozen=True)
class Capabilities:
    """What one environment makes (``makes``) and, for each capability it lacks, why (``lacks``)."""

    makes: frozenset[str]
    lacks: Mapping[str, str] = field(default_factory=dict)

    def to_extra(self) -> dict[str, Any]:
        """As a worker row's ``extra`` holds it."""
        return {"makes": sorted(self.makes), "lacks": dict(sorted(self.lacks.items()))}

    @classmethod
    def from_extra(cls, extra: Any) -> Capabilities | None:
        """A worker row's announcement; None for a worker that announced none (an older ctxfarm)."""
        if not isinstance(extra, dict) or not isinstance(extra.get("makes"), list):
            return None
        lacks = extra.get("lacks")
        lacks = lacks if isinstance(lacks, dict) else {}
        return cls(frozenset(str(c) for c in extra["makes"] if c in ALL),
                   {str(k): str(v)[:300] for k, v in lacks.items() if k in ALL})

    def why(self, capability: str) -> str:
        return self.lacks.get(capability) or "not announced"


def from_probe(probe: Mapping[str, Any], backend: str) -> Capabilities:
    """The capabilities of an environment from what its probe found (``workers.capability_child``):
    ``onnxruntime`` (version) and ``model_package`` (the API is there); ``genai`` (version) or
    ``genai_error``; ``genai_ep`` (the backend's EP registered with onnxruntime-genai) or
    ``genai_ep_error``."""
    makes: set[str] = set()
    lacks: dict[str, str] = {}
    ort = probe.get("onnxruntime")
    if ort and _version(ort)[:2] >= ORT_PACKAGE_MIN and probe.get("model_package"):
        makes.add(ORT_MODEL_PACKAGE)
    else:
        lacks[ORT_MODEL_PACKAGE] = (f"onnxruntime {ort} has no ModelPackage API (needs >= 1.32)" if ort
                                    else f"no onnxruntime: {probe.get('onnxruntime_error') or 'not installed'}")
    genai = probe.get("genai")
    if backend != "qnn":
        why = f"onnxruntime-genai folders are built for QNN; this is a {backend} toolchain"
    elif not genai:
        why = f"onnxruntime-genai is not importable ({str(probe.get('genai_error') or 'not installed')[:160]})"
    elif _version(genai)[:2] < GENAI_MIN:
        why = f"onnxruntime-genai {genai} is older than {'.'.join(map(str, GENAI_MIN))}"
    elif not probe.get("genai_ep"):
        why = f"onnxruntime-genai {genai} can't register the QNN EP ({str(probe.get('genai_ep_error'))[:160]})"
    else:
        why = ""
    for cap in (GENAI_PACKAGE, GENAI_FOLDER_CHECK, GENAI_TWIN):
        if why:
            lacks[cap] = why
        else:
            makes.add(cap)
    return Capabilities(frozenset(makes), lacks)


def short_list(makes: Sequence[str] | frozenset[str]) -> str:
    """``genai,folder-check,twin,ort-package`` (``farm workers``), ``-`` for none."""
    return ",".join(SHORT[c] for c in ALL if c in makes) or "-"


# ---- an LLM release's fan-out ---------------------------------------------------------------------

Fleet = Mapping[tuple[str, str], "Capabilities | None"]  # (backend, toolchain) -> what its workers make


@dataclass(frozen=True)
class GenaiFanOut:
    """The SDKs an LLM release builds for, per backend, and those left out with why."""

    versions: dict[str, list[str]]
    skipped: list[tuple[str, str, str]]  # (backend, toolchain, why)

    def warning(self) -> str | None:
        """One line for every SDK left out, or None."""
        if not self.skipped:
            return None
        left = "; ".join(f"{b.upper()} {v}: {why}" for b, v, why in self.skipped)
        kept = ", ".join(f"{b.upper()} {v}" for b, vs in sorted(self.versions.items()) for v in vs)
        return f"the genai package is not built for {left}; it is built for {kept}"


def can_make(fleet: Fleet, backend: str, version: str, capability: str = GENAI_PACKAGE) -> bool | None:
    """Whether the workers of (backend, version) make ``capability``; None when none is known."""
    if (backend, version) not in fleet:
        return None
    caps = fleet[(backend, version)]
    return caps is not None and capability in caps.makes


def _why(fleet: Fleet, backend: str, version: str) -> str:
    caps = fleet.get((backend, version))
    if caps is None:
        return "its workers announce no capabilities (an older ctxfarm: restart them)"
    return caps.why(GENAI_PACKAGE)


def _able(fleet: Fleet, backend: str) -> list[str]:
    return sorted((v for (b, v) in fleet if b == backend and can_make(fleet, b, v)), key=_version)


def check_genai_backends(backends: Sequence[str]) -> None:
    """A genai package's parts are weight-shared QNN context binaries: any other backend is
    refused before anything is read or written (not a missing TensorRT recipe found later)."""
    for backend in dict.fromkeys(backends):
        if backend != "qnn":
            raise CapabilityMissingError(
                f"--genai builds onnxruntime-genai folders of QNN context binaries; a {backend} target can't hold one",
                hint="give QNN targets (-t qnn:SM8650); TensorRT builds one model at a time (farm build MODEL -t trt:...)")


def check_here(backend: str, version: str, capabilities: Capabilities) -> None:
    """The embedded farm (``farm build --genai``, a service without a broker) builds with what is
    installed beside it: refused before anything compiles when that can't make the package."""
    if GENAI_PACKAGE not in capabilities.makes:
        raise CapabilityMissingError(
            f"this environment ({backend.upper()} {version}) can't make a genai package: "
            f"{capabilities.why(GENAI_PACKAGE)}",
            hint="pip install onnxruntime-genai==0.18.0 beside onnxruntime >= 1.31 (pip install 'ctxfarm[qnn]' has "
                 "both), or submit it to a cluster whose workers can (farm submit --genai; `farm workers` shows them)")


def genai_matrix(backends: Sequence[str], sdks: Sequence[str], served: Sequence[tuple[str, str]],
                 fleet: Fleet) -> GenaiFanOut:
    """Which SDKs an LLM release builds for (before anything is recorded or compiled).

    ``sdks`` named by the user: each one whose workers are known and can't make the package is
    refused (``capability-missing``, naming the SDKs that can); one no worker is known for is
    kept (``--allow-queue`` waits for it). No ``sdks``: every served SDK whose workers make the
    package; the others are left out (``skipped``: one warning); none left is refused.
    ``backends``: of the targets (a non-QNN one is refused: the parts are QNN context binaries)."""
    versions: dict[str, list[str]] = {}
    skipped: list[tuple[str, str, str]] = []
    check_genai_backends(backends)
    for backend in dict.fromkeys(backends):
        able = _able(fleet, backend)
        can = ", ".join(f"{backend.upper()} {v}" for v in able) or "no live worker"
        if sdks:
            refused = [v for v in sdks if can_make(fleet, backend, v) is False]
            if refused:
                why = "; ".join(f"{backend.upper()} {v}: {_why(fleet, backend, v)}" for v in refused)
                raise CapabilityMissingError(
                    f"no worker of {', '.join(f'{backend.upper()} {v}' for v in refused)} can make a genai package "
                    f"({why})", hint=f"made by: {can}; pass one of those with --sdk, or leave --sdk out "
                                     "(the release then builds for every SDK that can)")
            versions[backend] = list(sdks)
            continue
        mine = sorted((v for b, v in served if b == backend), key=_version)
        keep = [v for v in mine if can_make(fleet, backend, v)]
        skipped += [(backend, v, _why(fleet, backend, v)) for v in mine if v not in keep]
        if mine and not keep:
            why = "; ".join(f"{backend.upper()} {v}: {_why(fleet, backend, v)}" for v in mine)
            raise CapabilityMissingError(
                f"no live {backend.upper()} worker can make a genai package ({why})",
                hint="start a worker whose environment has onnxruntime-genai 0.18 (QNN 2.49.40 or 2.51.0: "
                     "infra/workers/qnn-*/requirements.txt, infra/farm-up.sh)")
        versions[backend] = keep
    return GenaiFanOut(versions, skipped)
