"""TensorRT on a GPU machine, in one command: install the TRT worker venv, build every light model
for this GPU through the farm (embedded registry: compile, publish), fetch each artifact as a
device would, load it with the TensorRT EP, compare outputs with the CPU EP on the same inputs,
and time compile vs context load. Prints a table, writes bench/out/trt_gpu.json.

    python bench/trt_gpu.py [--models squeezenet,resnet50,...] [--kind trt-10.14.1-cu13] [--wheelhouse DIR]

GPU machines may have no network: ``--wheelhouse DIR`` installs the worker venv from DIR only
(pip --no-index --find-links DIR). Prepare DIR where PyPI and NVIDIA's package index are
reachable, on the same OS/CPU and Python version:

    pip download -d DIR -r infra/workers/trt-10.14.1-cu13/requirements.txt '.[cluster]' setuptools wheel
    # tensorrt-cu13 is a placeholder sdist: with PIP_EXTRA_INDEX_URL set to NVIDIA's index,
    # pip download also fetches the real tensorrt_cu13_libs / tensorrt_cu13_bindings wheels.

Without an NVIDIA GPU it says so and exits 2 (nothing to measure).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = "squeezenet,resnet50,densenet121,inception_v1,inception_v2,shufflenet,vgg19,zfnet512,bvlc_alexnet"

INNER = r"""
import json, sys, time, os
from pathlib import Path
from farm.core.settings import Settings
from farm.pipeline.plan import build
from registry.install import fetch_artifact
from registry.index import Registry, find_artifact
from workers.trt.runner import TrtRunner, detect_gpu
import onnx
light = Path(onnx.__file__).parent / "backend/test/data/light"
gpu = detect_gpu()
settings = Settings.from_env({"FARM_HOME": sys.argv[2]})
rows = []
for m in sys.argv[1].split(","):
    model = light / f"light_{m}.onnx"
    t0 = time.perf_counter()
    (o,) = build(settings, model, [f"trt:{gpu.target}"]).outcomes
    if o.state != "built":
        rows.append({"model": m, "state": o.state, "error": f"{o.error_code}: {o.error_message}"[:300]})
        continue
    reg = Registry.open(settings)
    with reg.db.session() as s:
        art = find_artifact(s, o.artifact)
        s.expunge_all()
    got = fetch_artifact(reg.store, art, Path(sys.argv[2]) / "device" / m)
    reg.close()
    load = TrtRunner().load_check(got.ctx_model, None, reference_model=model)
    rows.append({"model": m, "state": "built", "compile_s": o.compile_seconds, "job_s": o.wall_seconds,
                 "load_s": load["load_seconds"], "run_s": load["run_seconds"], "max_abs_diff": load.get("max_abs_diff"),
                 "ctx_bytes": o.size, "placement": f"{o.nodes_ep}/{o.nodes_cpu}"})
print(json.dumps({"gpu": gpu.name, "target": gpu.target, "toolchain": TrtRunner().toolchain().to_dict(), "rows": rows}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--kind", default="trt-10.14.1-cu13")
    ap.add_argument("--wheelhouse", type=Path, help="install the worker venv from this directory only (offline)")
    args = ap.parse_args()
    if not shutil.which("nvidia-smi"):
        print("no NVIDIA GPU on this machine (nvidia-smi not found): TensorRT needs the GPU it builds for; "
              "nothing measured", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.wheelhouse:
        if not args.wheelhouse.is_dir():
            print(f"--wheelhouse {args.wheelhouse} is not a directory", file=sys.stderr)
            return 2
        env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(args.wheelhouse.resolve()))
    subprocess.run([str(ROOT / "infra" / "workers" / "create-venvs.sh"), args.kind], check=True, env=env)
    py = ROOT / ".venvs" / args.kind / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="ctxfarm-trt-") as home:
        proc = subprocess.run([str(py), "-c", INNER, args.models, home], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
        return 1
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    tc = data["toolchain"]
    print(f"GPU {data['gpu']} ({data['target']}), TensorRT {tc['version']}, onnxruntime-gpu {tc['ort_version']}, "
          f"CUDA {tc['extra'].get('cuda')}")
    print(f"{'model':14s} {'compile s':>10s} {'load ms':>9s} {'compile/load':>13s} {'max|diff| vs CPU':>17s} "
          f"{'ctx MiB':>8s} {'ctx/other':>10s}")
    for r in data["rows"]:
        if r["state"] != "built":
            print(f"{r['model']:14s} FAILED {r['error']}")
            continue
        print(f"{r['model']:14s} {r['compile_s']:10.2f} {r['load_s'] * 1000:9.1f} {r['compile_s'] / r['load_s']:13.0f} "
              f"{r['max_abs_diff']:17.2e} {r['ctx_bytes'] / 2**20:8.1f} {r['placement']:>10s}")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "trt_gpu.json").write_text(json.dumps(data, indent=2))
    return 0 if all(r["state"] == "built" for r in data["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
