"""QnnRunner: compiles EPContext models for the QNN HTP backend in a job process forked from a
warm compile host (workers.host), or in a fresh child process.

This module imports no onnxruntime: the toolchain is read from package metadata, and the
compile/load happens in ``workers.qnn.child``.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import shutil
from functools import lru_cache
from pathlib import Path
from typing import Any

from farm.core.catalog import Target
from farm.core.errors import MissingExtraError, ToolchainError
from workers.runner import CTX_MODEL_NAME, CompileJob, CompileOutput, Toolchain, collect_output, run_child

MEDIA_QNN_CONTEXT = "application/vnd.qualcomm.qnn.context-binary.v1"
CHILD = "workers.qnn.child"


@lru_cache(maxsize=1)
def detect_toolchain() -> Toolchain:
    """QNN SDK version and package versions of this environment, without importing them."""
    try:
        ep_version = md.version("onnxruntime-qnn")
    except md.PackageNotFoundError:
        raise MissingExtraError(
            "onnxruntime-qnn is not installed in this environment: no QNN toolchain to compile with",
            hint="pip install 'ctxfarm[qnn]'  (onnxruntime 1.31.1 + onnxruntime-qnn 2.7.0 = QNN 2.51.0)",
        ) from None
    ort_version = _dist_version("onnxruntime")
    spec = importlib.util.find_spec("onnxruntime_qnn")
    sdk = ""
    if spec and spec.submodule_search_locations:
        info = Path(next(iter(spec.submodule_search_locations))) / "build_and_package_info.py"
        if info.exists():
            for node in ast.parse(info.read_text()).body:
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "qnn_version" for t in node.targets
                ):
                    sdk = str(ast.literal_eval(node.value))
    if not sdk:
        raise ToolchainError(f"cannot read the QNN SDK version from onnxruntime-qnn {ep_version}")
    return Toolchain("qnn", sdk, ort_version, "onnxruntime-qnn", ep_version)


def _dist_version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        raise MissingExtraError(
            f"{name} is not installed", hint="pip install 'ctxfarm[qnn]'"
        ) from None


def provider_options(target: Target, options: dict[str, Any]) -> dict[str, str]:
    """Map normalized farm options to QNN EP provider options (backend_path added by the child)."""
    out: dict[str, str] = {"htp_graph_finalization_optimization_mode": str(options.get("graph_optimization", 0))}
    if target.soc_model is not None:
        out["soc_model"] = str(target.soc_model)
    if options.get("precision") == "fp16":
        out["enable_htp_fp16_precision"] = "1"
    if options.get("vtcm_mb"):
        out["vtcm_mb"] = str(options["vtcm_mb"])
    return out


class QnnRunner:
    backend = "qnn"

    def __init__(self, *, warm_host: bool = True):
        # False: a fresh ``python -m workers.qnn.child compile`` per build (what the bench compares).
        self.warm_host = warm_host

    def warm(self) -> None:
        """Start this process's compile host now (a worker at start), not at its first build."""
        from workers.host import pool_for

        pool_for(CHILD).warm(1)

    def toolchain(self) -> Toolchain:
        return detect_toolchain()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        toolchain = self.toolchain()
        out_dir = work_dir / "out"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        ctx_name = CTX_MODEL_NAME
        request = {
            "model": str(job.model_path),
            "ctx_path": str(out_dir / ctx_name),
            "embed_mode": int(job.options.get("embed_mode", 0)),
            "provider_options": provider_options(job.target, job.options),
            "verify_load": job.verify_load,
        }
        timings: dict[str, float] = {}
        if self.warm_host:
            # A job forked from this process's warm host (workers.host): no interpreter start,
            # import or EP registration per build; the same guards, bytes and error codes.
            from workers.host import pool_for

            result, wall, log, timings = pool_for(CHILD).run("compile", request, work_dir, timeout=job.timeout,
                                                             memory_mb=job.memory_mb, cancel=job.cancel)
        else:
            result, wall, log = run_child(CHILD, "compile", request, work_dir, timeout=job.timeout,
                                          memory_mb=job.memory_mb, cancel=job.cancel)
        out = collect_output("QNN", job, out_dir, ctx_name, result, wall, log, toolchain, MEDIA_QNN_CONTEXT,
                             strays="error")
        out.timings = timings
        return out

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        import tempfile

        self.toolchain()
        request = {"ctx_model": str(ctx_model.resolve()), "provider_options": provider_options(target, {})}
        with tempfile.TemporaryDirectory(prefix="ctxfarm-load-") as tmp:
            result, wall, _log = run_child(CHILD, "load", request, Path(tmp), timeout=timeout)
        result["wall_seconds"] = wall
        return result
