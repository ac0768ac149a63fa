"""The runner registry: backend name -> its Runner, and the few backend facts and calls the layers
above need (the CLI and the service reach workers/ only here, through farm.pipeline, and, for
``farm worker``, workers.main: import-linter contracts say so).

This is the only module above the backends that imports them (``workers.qnn``, ``workers.trt``);
they import the shared types below them (``workers.runner``) and never this module, so the
imports in ``workers/`` form no circle (an import-linter contract says so). Imports are inside
the functions: choosing a backend costs nothing until one is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.core.errors import MissingExtraError

if TYPE_CHECKING:
    from farm.core.catalog import Target
    from workers.epcontext import ContextModel
    from workers.runner import Runner, Toolchain
    from workers.trt.runner import GpuInfo

BACKENDS = ("qnn", "trt")


def get_runner(backend: str) -> Runner:
    """The Runner of ``backend`` (``qnn`` or ``trt``); MissingExtraError for any other name."""
    if backend == "qnn":
        from workers.qnn.runner import QnnRunner

        return QnnRunner()
    if backend == "trt":
        from workers.trt.runner import TrtRunner

        return TrtRunner()
    raise MissingExtraError(f"no runner for backend {backend!r}")


def qnn_toolchain() -> Toolchain:
    """The QNN toolchain installed here, read without importing onnxruntime."""
    from workers.qnn.runner import detect_toolchain

    return detect_toolchain()


def prestart_qnn_hosts(count: int) -> None:
    """Spawn QNN compile hosts for ``count`` concurrent compiles now, without waiting
    (``workers.host.HostPool.prestart``), so their start overlaps the caller's own work."""
    from workers.host import pool_for

    # workers.qnn.runner.CHILD, named here so the caller does not import the runner (and its catalog) first.
    pool_for("workers.qnn.child").prestart(count)


def probe_soon(backend: str) -> None:
    """Start this process's capability probe of ``backend`` now (``workers.capabilities.probe_soon``):
    the embedded genai build checks it before it records anything, and need not wait for it then."""
    from workers.capabilities import probe_soon as start

    start(backend)


def prestart_genai_check() -> None:
    """Spawn the warm genai folder-check host now (``workers.qnn.genai.prestart_check``)."""
    from workers.qnn.genai import prestart_check

    prestart_check()


def open_context(ctx_model: Path) -> ContextModel:
    """A context model read the way a runtime is about to load it: the file checks every backend
    shares (``workers.epcontext.open_context``: not-found, invalid-model, not-a-context)."""
    from workers.epcontext import open_context as read

    return read(ctx_model)


def detect_gpu(index: int = 0) -> GpuInfo:
    """This machine's NVIDIA GPU (nvidia-smi), for a TensorRT worker."""
    from workers.trt.runner import detect_gpu as detect

    return detect(index)


def trt_serves(gpu_target: str, build_target: str, options: dict[str, Any]) -> bool:
    """Can a TensorRT worker on ``gpu_target`` build for ``build_target`` with ``options``?"""
    from workers.trt.runner import serves

    return serves(gpu_target, build_target, options)


def check_accuracy(model: Path, ctx_model: Path, target: Target, work_dir: Path, **kw: Any) -> dict[str, Any]:
    """A QNN context run against its source model on the CPU EP (``workers.qnn.accuracy``)."""
    from workers.qnn.accuracy import check_accuracy as check

    return check(model, ctx_model, target, work_dir, **kw)


def measure_context(model: Path | None, ctx_model: Path, target: Target, work_dir: Path, **kw: Any) -> dict[str, Any]:
    """A device verification: load, first inference, steady-state median, peak memory, outputs
    against the CPU EP (``workers.qnn.verify.measure``; the device lab's agent)."""
    from workers.qnn.verify import measure

    return measure(model, ctx_model, target, work_dir, **kw)


def check_genai_folder(folder: Path, work_dir: Path, **kw: Any) -> dict[str, Any]:
    """A built genai folder as a device opens it (``workers.qnn.genai.check_folder``: og.Config,
    files, EPContext paths, each part's binary holding exactly its two graphs)."""
    from workers.qnn.genai import check_folder

    return check_folder(folder, work_dir, **kw)


def genai_twin(export_dir: Path, target: Target, options: dict[str, Any], work_dir: Path, **kw: Any) -> dict[str, Any]:
    """The twin of a genai package (``workers.qnn.genai.run_twin``): its parts compiled without
    sharing (or given: ``compiled={stage name: context model}``, from ``genai_twin_compile_part``),
    each part's prefill and one decode step checked on the simulator against the CPU EP (``parts``:
    PSNR per output), and greedy tokens generated on the simulator against the source pipeline
    on the CPU EP."""
    from workers.qnn.genai import run_twin

    return run_twin(export_dir, target, options, work_dir, **kw)


def genai_twin_compile_part(export_dir: Path, part_index: int, target: Target, options: dict[str, Any],
                            out_dir: Path, **kw: Any) -> dict[str, Any]:
    """One part's twin contexts: its prefill and decode graph compiled WITHOUT sharing into
    ``out_dir`` (``workers.qnn.genai.twin_compile_part``), as its own job. Returns ``{"files":
    {stage name: context model path}, "graphs", "compile_seconds", ...}``; every part's files
    together are ``genai_twin(..., compiled=...)``, which then compiles nothing."""
    from workers.qnn.genai import twin_compile_part

    return twin_compile_part(export_dir, part_index, target, options, out_dir, **kw)
