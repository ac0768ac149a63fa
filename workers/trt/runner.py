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
from farm.core.errors import (
    BadOptionsError,
    MissingExtraError,
    NoWorkerError,
    ToolchainError,
    UnknownTargetError,
    UnsupportedOpsError,
)
from workers.runner import CTX_MODEL_NAME, CompileJob, CompileOutput, Toolchain, collect_output, run_child
from workers.trt.ep_options import ACCEPTED, BOOLEAN, FALSE, ORT_GPU_VERSION, TRUE

MEDIA_TRT_ENGINE = "application/vnd.nvidia.tensorrt.engine.v1"
CHILD = "workers.trt.child"
TRT_DISTS = ("tensorrt-cu13", "tensorrt-cu13-libs", "tensorrt", "tensorrt-cu12", "tensorrt-cu12-libs")


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


KIND = "trt-10.14.1-cu13"  # infra/workers/<KIND>/requirements.txt: the pinned worker environment
INSTALL_HINT = (f"pip install -r infra/workers/{KIND}/requirements.txt (tensorrt-cu13 on PyPI is a placeholder that "
                "downloads from NVIDIA's own index: point PIP_EXTRA_INDEX_URL there, or use a wheelhouse)")


def trt_version() -> str:
    """The full four-part TensorRT version (NVIDIA promises engine reuse only for the same
    major.minor.patch.build), read from the installed distribution's metadata."""
    for dist in TRT_DISTS:
        try:
            v = md.version(dist)
        except md.PackageNotFoundError:
            continue
        return ".".join(v.split(".")[:4]).split(".post")[0]  # 10.14.1.48.post1 -> 10.14.1.48
    raise MissingExtraError("TensorRT is not installed in this environment", hint=INSTALL_HINT)


def platform_tag() -> str:
    """Engines do not move across OS/CPU platforms: part of the TensorRT toolchain identity."""
    import platform as _platform
    import sys

    return f"{sys.platform}-{_platform.machine().lower()}".replace("_", "-")


def toolchain_version(trt: str, platform: str) -> str:
    """The build key's toolchain for TensorRT: ``10.14.1.48+linux-x86-64``."""
    return f"{trt}+{platform}"


@lru_cache(maxsize=1)
def detect_toolchain() -> Toolchain:
    try:
        ort_version = md.version("onnxruntime-gpu")
    except md.PackageNotFoundError:
        raise MissingExtraError("onnxruntime-gpu is not installed: no TensorRT EP here", hint=INSTALL_HINT) from None
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
    trt = trt_version()
    return Toolchain("trt", toolchain_version(trt, platform_tag()), ort_version, "onnxruntime-gpu", ort_version,
                     {"tensorrt": trt, "platform": platform_tag(), "cuda": cuda, "gpu": gpu.name,
                      "compute_capability": gpu.compute_capability, "driver": gpu.driver})


ENGINE_DIR = "engines"  # relative: in dump mode the EP resolves it against the context model's dir


def _flag(value: bool) -> str:
    return TRUE if value else FALSE


def provider_options(options: dict[str, Any], out_dir: Path, cache_dir: Path, ctx_name: str) -> dict[str, str]:
    """Map normalized farm options to TensorRT EP provider options for a context-model build.

    Only keys the pinned binding accepts (``workers.trt.ep_options``); booleans as True/False.
    The engine cache path is relative, so the EP writes a relative ``ep_cache_context`` that the
    artifact can carry (an absolute one would point into this worker's temp dir)."""
    out: dict[str, str] = {
        "trt_dump_ep_context_model": TRUE,
        "trt_ep_context_file_path": str(out_dir / ctx_name),
        "trt_ep_context_embed_mode": str(int(options.get("embed_mode", 0))),
        "trt_engine_cache_enable": TRUE,
        "trt_engine_cache_path": ENGINE_DIR,
        "trt_timing_cache_enable": TRUE,
        "trt_timing_cache_path": str(cache_dir),
        "trt_builder_optimization_level": str(options.get("builder_optimization_level", 3)),
    }
    precision = options.get("precision", "fp32")
    if precision in ("fp16", "int8"):
        out["trt_fp16_enable"] = TRUE
    if precision == "int8":
        out["trt_int8_enable"] = TRUE
        out["trt_int8_calibration_table_name"] = str(options["calibration_table"])
    if options.get("workspace_mb"):
        out["trt_max_workspace_size"] = str(int(options["workspace_mb"]) * 1024 * 1024)
    if options.get("hardware_compatibility_level") == "ampere_plus":
        out["trt_engine_hw_compatible"] = TRUE
    for key in ("profile_min_shapes", "profile_opt_shapes", "profile_max_shapes"):
        if options.get(key):
            out[f"trt_{key}"] = str(options[key])
    unknown = sorted(set(out) - ACCEPTED)
    assert not unknown, f"not accepted by onnxruntime-gpu {ORT_GPU_VERSION}: {unknown}"
    assert all(out[k] in (TRUE, FALSE) for k in out if k in BOOLEAN)
    return out


# The EP writes the compute capability into EPContext's hardware_architecture only when this
# environment variable is set (there is no provider option for it in 1.31.1).
CHILD_ENV = {"ORT_EP_CONTEXT_COMPUTE_CAPABILITY_ENABLE": "1"}


def hw_compatible_supported(target: str) -> bool:
    """The EP silently turns trt_engine_hw_compatible off on sm_87 (Jetson Orin) and below sm_80."""
    cc = _compute_capability(target)
    return cc >= 8.0 and target != "sm_87"


def _compute_capability(target: str) -> float:
    try:
        return float(load_catalog().get(target, backend="trt").compute_capability or 0)
    except UnknownTargetError:
        raise NoWorkerError(f"GPU compute capability {target} is not in the target catalog",
                            hint="add it to farm/core/catalog/targets.toml (name, compute_capability) and "
                                 "redeploy, then start the worker again") from None


def serves(gpu_target: str, build_target: str, options: dict[str, Any]) -> bool:
    """Can a worker on ``gpu_target`` build this? Same GPU, or an Ampere+ GPU where the EP really
    builds hardware-compatible engines (not sm_87). Unknown GPUs: NoWorkerError, by name."""
    if options.get("hardware_compatibility_level") == "ampere_plus":
        return hw_compatible_supported(gpu_target)
    _compute_capability(gpu_target)
    return gpu_target == build_target


def dynamic_inputs(model_path: Path) -> dict[str, list[Any]]:
    """Graph inputs (not initializers) with a symbolic or unknown dimension: name -> dims."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    out: dict[str, list[Any]] = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in inp.type.tensor_type.shape.dim]
        if any(not isinstance(d, int) or d <= 0 for d in dims):
            out[inp.name] = dims
    return out


def check_profiles(model_path: Path, options: dict[str, Any]) -> None:
    """The EP writes the context model with an empty engine and builds it on the first run,
    locked to that run's shapes, when a dynamic input has no profile: require one."""
    dynamic = dynamic_inputs(model_path)
    if not dynamic:
        return
    named = {item.rpartition(":")[0] for item in str(options.get("profile_opt_shapes", "")).split(",") if item}
    missing = sorted(set(dynamic) - named)
    if missing:
        raise BadOptionsError(
            "dynamic input(s) without a shape profile: " + ", ".join(f"{n} {dynamic[n]}" for n in missing),
            hint="give profile_min_shapes, profile_opt_shapes and profile_max_shapes for each, e.g. "
                 "profile_opt_shapes=" + ",".join(f"{n}:1x3x224x224" for n in missing[:2]))


def check_whole(source: Path, ctx_model: Path) -> None:
    """The EP dumps one EPContext node for the TensorRT subgraph only: a model that fell partly to
    another EP yields a context model with other inputs/outputs than the source. Refuse it."""
    import onnx

    src = onnx.load(str(source), load_external_data=False)
    ctx = onnx.load(str(ctx_model), load_external_data=False)
    inits = {i.name for i in src.graph.initializer}
    src_io = ({i.name for i in src.graph.input} - inits, {o.name for o in src.graph.output})
    ctx_io = ({i.name for i in ctx.graph.input}, {o.name for o in ctx.graph.output})
    if src_io != ctx_io:
        gone = sorted((src_io[0] - ctx_io[0]) | (src_io[1] - ctx_io[1]))
        extra = sorted((ctx_io[0] - src_io[0]) | (ctx_io[1] - src_io[1]))
        raise UnsupportedOpsError(
            "TensorRT took only part of the model: the dumped context model covers the TensorRT subgraph "
            f"alone (source I/O missing from it: {gone[:8]}; subgraph boundaries: {extra[:8]})",
            hint="nodes outside TensorRT's support stay on the CPU and are not in the context model: replace "
                 "them, or ship the model without a TensorRT context")


def check_hw_architecture(nodes: list[dict[str, Any]], options: dict[str, Any]) -> None:
    if options.get("hardware_compatibility_level") != "ampere_plus":
        return
    got = {str(n.get("hardware_architecture", "")) for n in nodes}
    if got != {"80+"}:
        raise ToolchainError(f"asked for a hardware-compatible (Ampere+) engine, the EP wrote "
                             f"hardware_architecture={sorted(got)} (expected '80+')")


class TrtRunner:
    backend = "trt"

    def toolchain(self) -> Toolchain:
        return detect_toolchain()

    def compile(self, job: CompileJob, work_dir: Path) -> CompileOutput:
        check_profiles(job.model_path, job.options)
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
        if job.options.get("profile_opt_shapes"):
            request["opt_shapes"] = str(job.options["profile_opt_shapes"])
        result, wall, log = run_child(CHILD, "compile", request, work_dir, timeout=job.timeout,
                                      memory_mb=job.memory_mb, cancel=job.cancel, env=CHILD_ENV)
        if (out_dir / ctx_name).exists():
            check_whole(job.model_path, out_dir / ctx_name)
        # Profiles and timing caches are build leftovers, not part of the artifact.
        out = collect_output("TensorRT", job, out_dir, ctx_name, result, wall, log, toolchain, MEDIA_TRT_ENGINE,
                             strays="delete")
        check_hw_architecture(out.epcontext, job.options)
        return out

    def load_check(self, ctx_model: Path, target: Target, *, timeout: float = 300.0,
                   reference_model: Path | None = None) -> dict[str, Any]:
        import tempfile

        request: dict[str, Any] = {"ctx_model": str(ctx_model.resolve()),
                                   "reference_model": str(reference_model) if reference_model else None}
        with tempfile.TemporaryDirectory(prefix="ctxfarm-load-") as tmp:
            result, wall, _ = run_child(CHILD, "load", request, Path(tmp), timeout=timeout, env=CHILD_ENV)
        result["wall_seconds"] = wall
        return result
