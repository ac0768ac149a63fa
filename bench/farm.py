"""Farm overhead: a release of N real QNN compiles over 2 workers vs the same compiles run raw.

Same run, same machine: first every (model, SoC) is compiled directly through the runner (the
raw cost); then a private farm (Redis, PostgreSQL, SeaweedFS, 2 workers of the 2.51.0 venv)
builds the same matrix as one release; then the same release is submitted again (fully cached).
Prints a table and writes bench/out/farm.json.

    python bench/farm.py [--models squeezenet,resnet50,...] [--socs SM8650,SM8750] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from farm.devfarm import services, wait_live, workers  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402

DEFAULT_MODELS = "squeezenet,resnet50,inception_v1,shufflenet,densenet121,inception_v2"


def raw_compiles(models: list[str], socs: list[str], venv: Path) -> list[dict[str, float]]:
    """Each compile through the runner of the worker venv, one after another."""
    code = (
        "import json,sys,tempfile;from pathlib import Path;from farm.core.catalog import parse_target;"
        "from farm.core.options import normalize;from workers.runner import CompileJob;"
        "from workers.qnn.runner import QnnRunner;"
        "r=QnnRunner();out=[]\n"
        "for m,soc in json.loads(sys.argv[1]):\n"
        " t=parse_target('qnn:'+soc)\n"
        " with tempfile.TemporaryDirectory() as d:\n"
        "  o=r.compile(CompileJob(Path(m),t,normalize('qnn',{},t),600),Path(d))\n"
        "  out.append({'compile_s':o.compile_seconds,'child_s':o.wall_seconds})\n"
        "print(json.dumps(out))"
    )
    pairs = [[str(light(m)), s] for m in models for s in socs]
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code, json.dumps(pairs)], capture_output=True,
                          text=True, check=True, cwd=ROOT)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def farm_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm.cli", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--socs", default="SM8650,SM8750")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sdk", default="2.51.0")
    args = ap.parse_args()
    models, socs = args.models.split(","), args.socs.split(",")
    venv = ROOT / ".venvs" / f"qnn-{args.sdk}"
    if not (venv / "bin" / "farm").exists():
        print(f"{venv} missing: run infra/workers/create-venvs.sh", file=sys.stderr)
        return 1
    n = len(models) * len(socs)
    raw = raw_compiles(models, socs, venv)
    sum_child = sum(r["child_s"] for r in raw)
    sum_compile = sum(r["compile_s"] for r in raw)
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as tmp, services(Path(tmp), keep=False) as env:
        env = {**env, "FARM_HEARTBEAT_SECONDS": "2"}
        farm_cli(env, "db", "upgrade")
        with workers(env, [venv] * args.workers, Path(tmp)):
            wait_live(env, args.workers)
            # One release per model (a release is one model over a matrix); all submitted, then awaited.
            t0 = time.perf_counter()
            releases = []
            for m in models:
                out = json.loads(farm_cli(env, "submit", str(light(m)), *sum((["-t", f"qnn:{s}"] for s in socs), []),
                                          "--sdk", args.sdk, "--name", m, "--json").stdout)
                releases.append(out["release"])
            for r in releases:
                farm_cli(env, "status", str(r))
            from farm.core.settings import Settings
            from farm.pipeline.plan import wait_release

            settings = Settings.from_env({**os.environ, **env})
            states = [wait_release(settings, r, timeout=1800, poll=0.2) for r in releases]
            wall = time.perf_counter() - t0
            assert all(st.ok for st in states), [st.builds for st in states]
            farm_compile = sum(b["compile_seconds"] for st in states for b in st.builds)
            t1 = time.perf_counter()
            for m in models:
                out = json.loads(farm_cli(env, "submit", str(light(m)), *sum((["-t", f"qnn:{s}"] for s in socs), []),
                                          "--sdk", args.sdk, "--name", m, "--json").stdout)
                assert all(b["state"] == "succeeded" for b in out["builds"])
            cached = time.perf_counter() - t1
    ideal = sum_child / args.workers
    overhead_ms = (wall * args.workers - sum_child) / n * 1000
    rows = [
        ("raw EP compiles, sum (session creation)", sum_compile, sum_compile / sum_child),
        ("raw compile jobs, sum (child process each)", sum_child, 1.0),
        (f"ideal farm wall = raw jobs / {args.workers} workers", ideal, ideal / sum_child),
        (f"farm release wall, {n} builds, {args.workers} workers", wall, wall / sum_child),
        ("EP compile inside the farm, sum", farm_compile, farm_compile / sum_child),
        (f"cached re-submission of all {len(models)} releases (CLI)", cached, cached / sum_child),
    ]
    print(f"{n} builds: models {','.join(models)} x SoCs {','.join(socs)}, QNN {args.sdk}, {args.workers} workers, "
          f"{os.cpu_count()} CPUs")
    print(f"{'measure':58s} {'seconds':>9s} {'x raw jobs':>11s}")
    for name, secs, ratio in rows:
        print(f"{name:58s} {secs:9.3f} {ratio:11.3f}")
    print(f"farm overhead per build: {overhead_ms:.0f} ms of worker time "
          f"((wall x workers - raw jobs) / builds); cached release answered in {cached / len(models) * 1000:.0f} ms each")
    out_dir = ROOT / "bench" / "out"
    out_dir.mkdir(exist_ok=True)
    (out_dir / "farm.json").write_text(json.dumps({"builds": n, "workers": args.workers, "rows": rows,
                                                   "overhead_ms_per_build": overhead_ms}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
