"""QnnRunner: compiles EPContext models for the QNN HTP backend in a child process.

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

from farm.catalog import Target
from farm.errors import MissingExtraError, ToolchainError, UnsupportedOpsError
from workers.epcontext import read_epcontext, referenced_files
from workers.runner import MEDIA_CTX_MODEL, CompileJob, CompileOutput, OutputFile, Toolchain, run_child

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

    def toolchain(self) -> Toolchain:
        return detect_toolchain()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        toolchain = self.toolchain()
        out_dir = work_dir / "out"
        if out_dir.exists():
            shutil.rmtree(out_dir)
        out_dir.mkdir(parents=True)
        ctx_name = f"{job.ctx_stem}_ctx.onnx"
        request = {
            "model": str(job.model_path),
            "ctx_path": str(out_dir / ctx_name),
            "embed_mode": int(job.options.get("embed_mode", 0)),
            "provider_options": provider_options(job.target, job.options),
            "verify_load": job.verify_load,
        }
        result, wall, log = run_child(CHILD, "compile", request, work_dir, timeout=job.timeout)
        ctx_path = out_dir / ctx_name
        if not ctx_path.exists():
            raise ToolchainError("the QNN EP finished without writing a context model", details={"log": log})
        nodes, placement = read_epcontext(ctx_path)
        if not nodes:
            raise UnsupportedOpsError(
                "the QNN EP took no node of this model: nothing to put in a context binary",
                hint=f"ops in the model: {', '.join(placement['cpu_op_types'])}",
                details={"log": log, "cpu_op_types": placement["cpu_op_types"]},
            )
        if job.options.get("require_full_offload") and placement["cpu_nodes"]:
            ops = ", ".join(placement["cpu_op_types"])
            raise UnsupportedOpsError(
                f"{placement['cpu_nodes']} node(s) would stay on the CPU ({ops}) and full offload is required",
                hint="drop require_full_offload=true to ship a partially offloaded model, or replace these ops",
                details={"log": log, "cpu_op_types": placement["cpu_op_types"]},
            )
        files = [OutputFile(ctx_name, ctx_path, "ctx-model", MEDIA_CTX_MODEL)]
        for rel in referenced_files(nodes, out_dir):
            files.append(OutputFile(rel, out_dir / rel, "context", MEDIA_QNN_CONTEXT))
        known = {f.name for f in files}
        strays = sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file()
                        and str(p.relative_to(out_dir)) not in known)
        if strays:
            raise ToolchainError(f"the QNN EP wrote files the context model does not reference: {strays}")
        return CompileOutput(
            out_dir=out_dir,
            ctx_model=ctx_name,
            files=files,
            compile_seconds=float(result["compile_seconds"]),
            wall_seconds=wall,
            epcontext=nodes,
            placement=placement,
            toolchain=toolchain,
            log=log,
            self_load=result.get("self_load"),
        )

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0) -> dict[str, Any]:
        import tempfile

        self.toolchain()
        request = {"ctx_model": str(ctx_model.resolve()), "provider_options": provider_options(target, {})}
        with tempfile.TemporaryDirectory(prefix="ctxfarm-load-") as tmp:
            result, wall, _log = run_child(CHILD, "load", request, Path(tmp), timeout=timeout)
        result["wall_seconds"] = wall
        return result
