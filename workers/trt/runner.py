"""TrtRunner: TensorRT EP context models (engine + ``*_ctx.onnx``), compiled in a child process.

TensorRT builds for the GPU it runs on: the worker reads its GPU's compute capability at start
and serves ``compile.trt.<trt version>.<sm_XX>`` (plus ``...ampere_plus`` for
hardware-compatible engines). No onnxruntime or tensorrt import here.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from farm.core.catalog import Target, load_catalog
from farm.core.errors import MissingExtraError, NoWorkerError
from workers.runner import CTX_MODEL_NAME, CompileJob, CompileOutput, Toolchain, collect_output, run_child

MEDIA_TRT_ENGINE = "application/vnd.nvidia.tensorrt.engine.v1"
CHILD = "workers.trt.child"
TRT_DISTS = ("tensorrt-cu12", "tensorrt-cu13", "tensorrt", "tensorrt-cu12-libs", "tensorrt-cu13-libs")


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str  # "9.0"
    driver: str

    @property
    def target(self) -> str:
        major, _, minor = self.compute_capability.partition(".")
        return f"sm_{major}{minor or '0'}"


def parse_nvidia_smi(text: str) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1]:
            gpus.append(GpuInfo(parts[0], parts[1], parts[2]))
    return gpus


@lru_cache(maxsize=1)
def detect_gpu(index: int = 0) -> GpuInfo:
    exe = shutil.which("nvidia-smi")
    if not exe:
        raise NoWorkerError("no NVIDIA GPU here (nvidia-smi not found): TensorRT builds need the GPU they target",
                            hint="run the TRT worker on a machine with an NVIDIA GPU and driver")
    out = subprocess.run([exe, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=30)
    gpus = parse_nvidia_smi(out.stdout)
    if out.returncode != 0 or len(gpus) <= index:
        raise NoWorkerError(f"nvidia-smi found no usable GPU: {out.stderr.strip() or out.stdout.strip()}")
    return gpus[index]


def trt_version() -> str:
    for dist in TRT_DISTS:
        try:
            v = md.version(dist)
        except md.PackageNotFoundError:
            continue
        return ".".join(v.split(".")[:3])  # 10.13.3.9 -> 10.13.3 (engines are tied to the release)
    raise MissingExtraError("TensorRT is not installed in this environment",
                            hint="pip install -r infra/workers/trt-10.13.3-cu12/requirements.txt")


@lru_cache(maxsize=1)
def detect_toolchain() -> Toolchain:
    try:
        ort_version = md.version("onnxruntime-gpu")
    except md.PackageNotFoundError:
        raise MissingExtraError("onnxruntime-gpu is not installed: no TensorRT EP here",
                                hint="pip install -r infra/workers/trt-10.13.3-cu12/requirements.txt") from None
    cuda = ""
    spec = importlib.util.find_spec("onnxruntime")
    if spec and spec.submodule_search_locations:
        info = Path(next(iter(spec.submodule_search_locations))) / "capi" / "build_and_package_info.py"
        if info.exists():
            for node in ast.parse(info.read_text()).body:
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "cuda_version"
                                                        for t in node.targets):
                    cuda = str(ast.literal_eval(node.value))
    gpu = detect_gpu()
    return Toolchain("trt", trt_version(), ort_version, "onnxruntime-gpu", ort_version,
                     {"cuda": cuda, "gpu": gpu.name, "compute_capability": gpu.compute_capability,
                      "driver": gpu.driver})


def provider_options(options: dict[str, Any], out_dir: Path, cache_dir: Path, ctx_name: str) -> dict[str, str]:
    """Map normalized farm options to TensorRT EP provider options for a context-model build."""
    out: dict[str, str] = {
        "trt_dump_ep_context_model": "1",
        "trt_ep_context_file_path": str(out_dir / ctx_name),
        "trt_ep_context_embed_mode": str(options.get("embed_mode", 0)),
        "trt_ep_context_compute_capability_enable": "1",
        # Engines land beside the context model so its relative ep_cache_context resolves.
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": str(out_dir),
        "trt_timing_cache_enable": "1",
        "trt_timing_cache_path": str(cache_dir),
        "trt_builder_optimization_level": str(options.get("builder_optimization_level", 3)),
    }
    precision = options.get("precision", "fp32")
    if precision in ("fp16", "int8"):
        out["trt_fp16_enable"] = "1"
    if precision == "int8":
        out["trt_int8_enable"] = "1"
        out["trt_int8_calibration_table_name"] = str(options["calibration_table"])
    if options.get("workspace_mb"):
        out["trt_max_workspace_size"] = str(int(options["workspace_mb"]) * 1024 * 1024)
    if options.get("hardware_compatibility_level") == "ampere_plus":
        out["trt_engine_hw_compatible"] = "1"
    for key in ("profile_min_shapes", "profile_opt_shapes", "profile_max_shapes"):
        if options.get(key):
            out[f"trt_{key}"] = str(options[key])
    return out


def serves(gpu_target: str, build_target: str, options: dict[str, Any]) -> bool:
    """Can a worker on ``gpu_target`` build this? Same GPU, or any sm_80+ for Ampere+ engines."""
    if options.get("hardware_compatibility_level") == "ampere_plus":
        cc = float(load_catalog().get(gpu_target, backend="trt").compute_capability or 0)
        return cc >= 8.0
    return gpu_target == build_target


class TrtRunner:
    backend = "trt"

    def toolchain(self) -> Toolchain:
        return detect_toolchain()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        toolchain = self.toolchain()
        gpu = detect_gpu()
        if not serves(gpu.target, job.target.name, job.options):
            raise NoWorkerError(f"this GPU is {gpu.target} ({gpu.name}); the build is for {job.target.name}")
        out_dir, cache_dir = work_dir / "out", work_dir / "cache"
        for d in (out_dir, cache_dir):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        ctx_name = CTX_MODEL_NAME
        popts = provider_options(job.options, out_dir, cache_dir, ctx_name)
        if job.options.get("calibration_table"):
            popts["trt_int8_calibration_table_name"] = str(Path(job.options["calibration_table"]).resolve())
        request = {"model": str(job.model_path), "ctx_path": str(out_dir / ctx_name), "provider_options": popts}
        result, wall, log = run_child(CHILD, "compile", request, work_dir, timeout=job.timeout,
                                      memory_mb=job.memory_mb, cancel=job.cancel)
        # Profiles and timing caches are build leftovers, not part of the artifact.
        return collect_output("TensorRT", job, out_dir, ctx_name, result, wall, log, toolchain, MEDIA_TRT_ENGINE,
                              strays="delete")

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0,
                   reference_model: Path | None = None) -> dict[str, Any]:
        import tempfile

        request: dict[str, Any] = {"ctx_model": str(ctx_model.resolve()),
                                   "reference_model": str(reference_model) if reference_model else None}
        with tempfile.TemporaryDirectory(prefix="ctxfarm-load-") as tmp:
            result, wall, _ = run_child(CHILD, "load", request, Path(tmp), timeout=timeout)
        result["wall_seconds"] = wall
        return result
