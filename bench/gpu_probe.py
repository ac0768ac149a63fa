"""What the TRT worker sees on a GPU machine before its environment exists: the GPU as the worker
detects it (``nvidia-smi``), its catalog target, which builds it serves, and what is missing to
compile (TensorRT, onnxruntime-gpu). Stdlib only: runs on a bare GPU image from a checkout.

    python3 bench/gpu_probe.py [--out FILE]

Prints JSON (and writes FILE). Without an NVIDIA GPU: the worker's own ``no-worker`` error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.core.catalog import load_catalog  # noqa: E402
from farm.core.errors import FarmError  # noqa: E402


def probe() -> dict[str, object]:
    import workers.trt.runner as r

    out: dict[str, object] = {}
    try:
        g = r.detect_gpu()
    except FarmError as exc:
        return {"error": [exc.code, exc.message, exc.hint]}
    out["gpu"] = {"name": g.name, "compute_capability": g.compute_capability, "driver": g.driver, "target": g.target}
    t = load_catalog().get(g.target, backend="trt")
    out["catalog"] = {"name": t.name, "compute_capability": t.compute_capability}
    out["hw_compatible_supported"] = r.hw_compatible_supported(g.target)
    out["serves_same"] = r.serves(g.target, g.target, {})
    out["serves_sm_80_ampere_plus"] = r.serves(g.target, "sm_80", {"hardware_compatibility_level": "ampere_plus"})
    out["serves_sm_89"] = r.serves(g.target, "sm_89", {})
    for name in ("tensorrt", "tensorrt_libs", "onnxruntime"):
        out["has_" + name] = importlib.util.find_spec(name) is not None
    try:
        out["trt_version"] = r.trt_version()
    except FarmError as exc:
        out["trt_version_error"] = [type(exc).__name__, exc.code, exc.hint]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = probe()
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 2 if "error" in out else 0


if __name__ == "__main__":
    raise SystemExit(main())
