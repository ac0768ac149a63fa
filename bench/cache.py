"""Compile vs answer-from-the-index, on the embedded registry (issue 2's "50x" goal).

Builds a light model for two SoCs in a temp FARM_HOME, then re-submits the same build. Prints a
table and writes JSON to bench/out/cache.json. Ratios are against the compile measured in the
same run; nothing is compared with a fixed time.

    python bench/cache.py [--model squeezenet] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.core.settings import Settings  # noqa: E402
from farm.pipeline.plan import build  # noqa: E402
from registry.index import Registry  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402

TARGETS = ["qnn:SM8650", "qnn:SM8750"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    model = light(args.model)
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as home:
        env = {"FARM_HOME": home}
        settings = Settings.from_env(env)
        reg = Registry.open(settings)
        t0 = time.perf_counter()
        first = build(settings, model, TARGETS, registry=reg)
        first_s = time.perf_counter() - t0
        assert all(o.state == "built" for o in first.outcomes), first.outcomes
        cached = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            again = build(settings, model, TARGETS, registry=reg)
            cached.append(time.perf_counter() - t0)
            assert all(o.state == "cached" for o in again.outcomes)
        reg.close()
        cli = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "farm.cli", "build", str(model), *sum((["-t", t] for t in TARGETS), [])],
                           env={**__import__("os").environ, **env}, check=True, capture_output=True)
            cli.append(time.perf_counter() - t0)
    compile_s = sum(o.compile_seconds or 0 for o in first.outcomes)
    child_s = sum(o.wall_seconds or 0 for o in first.outcomes)
    cached_p50 = statistics.median(cached)
    rows = [
        ("EP compile (session creation, sum of 2 targets)", compile_s, 1.0),
        ("compile job (child process, sum of 2 targets)", child_s, child_s / compile_s),
        ("first farm build, in-process (compile + publish)", first_s, first_s / compile_s),
        (f"cached build, in-process, p50 of {args.repeat}", cached_p50, cached_p50 / compile_s),
        ("cached `farm build` CLI, end to end, median of 3", statistics.median(cli), statistics.median(cli) / compile_s),
    ]
    print(f"model light_{args.model}, targets {', '.join(TARGETS)}")
    print(f"{'measure':55s} {'seconds':>10s} {'x EP compile':>13s}")
    for name, secs, ratio in rows:
        print(f"{name:55s} {secs:10.4f} {ratio:13.4f}")
    print(f"index answer is {compile_s / cached_p50:.0f}x faster than the EP compile, "
          f"{first_s / cached_p50:.0f}x faster than the first build")
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "cache.json").write_text(json.dumps({"model": args.model, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
