"""Child process for TensorRT compiles and loads: the only place that imports onnxruntime-gpu.

    python -m workers.trt.child compile|load REQUEST.json RESULT.json
"""

from __future__ import annotations

import sys
import time
from typing import Any

from workers.childproc import run_commands

PROVIDER = "TensorrtExecutionProvider"


def _preload(ort: Any) -> None:
    """The TensorRT provider library has no RUNPATH: load CUDA/cuDNN (ORT's own preloader) and
    TensorRT (its wheel's import loads libnvinfer) before the first session."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        preload()
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        try:
            import tensorrt_libs  # noqa: F401
        except ImportError:
            pass  # the session will say which library is missing


def _opt_feeds(sess: Any, opt_shapes: str) -> dict[str, Any]:
    """Inputs shaped by the profile's opt values (``name:1x3x224x224,...``)."""
    import numpy as np

    shapes = {name: [int(d) for d in dims.split("x")]
              for name, _, dims in (item.rpartition(":") for item in opt_shapes.split(",") if item)}
    rng = np.random.default_rng(0)
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
             "tensor(int32)": np.int32, "tensor(uint8)": np.uint8}
    return {i.name: rng.random(shapes.get(i.name) or [d if isinstance(d, int) and d > 0 else 1 for d in i.shape])
            .astype(types.get(i.type, np.float32)) for i in sess.get_inputs()}


def compile_model(req: dict[str, Any]) -> dict[str, Any]:
    import os

    import onnxruntime as ort

    _preload(ort)
    so = ort.SessionOptions()
    so.log_severity_level = 2
    providers = [(PROVIDER, req["provider_options"]), ("CUDAExecutionProvider", {})]
    start = time.perf_counter()
    sess = ort.InferenceSession(req["model"], so, providers=providers, enable_fallback=0)
    if PROVIDER not in sess.get_providers():
        raise RuntimeError(f"TensorRT EP not available: session providers {sess.get_providers()}")
    if not os.path.exists(req["ctx_path"]) or req.get("opt_shapes"):
        # With dynamic inputs the EP may build the engine on the first run: run once at the
        # profile's opt shapes (the runner refuses dynamic inputs without a profile).
        sess.run(None, _opt_feeds(sess, req.get("opt_shapes", "")))
    return {"compile_seconds": time.perf_counter() - start, "providers": sess.get_providers()}


def load_model(req: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    _preload(ort)
    so = ort.SessionOptions()
    so.log_severity_level = 2
    start = time.perf_counter()
    sess = ort.InferenceSession(req["ctx_model"], so, providers=[PROVIDER, "CUDAExecutionProvider"],
                                enable_fallback=0)
    load_seconds = time.perf_counter() - start
    feeds = _opt_feeds(sess, req.get("opt_shapes", ""))
    start = time.perf_counter()
    outputs = sess.run(None, feeds)
    run_seconds = time.perf_counter() - start
    result: dict[str, Any] = {"load_seconds": load_seconds, "run_seconds": run_seconds,
                              "outputs": [list(o.shape) for o in outputs], "providers": sess.get_providers()}
    if req.get("reference_model"):
        cpu = ort.InferenceSession(req["reference_model"], providers=["CPUExecutionProvider"])
        ref = cpu.run(None, feeds)
        result["max_abs_diff"] = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                                     for a, b in zip(outputs, ref, strict=True))
    return result


def main(argv: list[str]) -> int:
    return run_commands(argv, {"compile": compile_model, "load": load_model})


if __name__ == "__main__":
    sys.exit(main(sys.argv))
