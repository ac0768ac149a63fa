"""Per-build cost of the compile process outside the EP's compile: a fresh child per build vs a
job forked from the warm compile host (workers.host), against a plain in-process loop.

The set: 6 light models (squeezenet, resnet50, inception_v1, shufflenet, densenet121,
inception_v2) x SM8650/SM8750 = 12 builds, with this environment's QNN SDK. Modes:

- ``loop``: one Python process, ``InferenceSession`` with ``ep.context_enable`` and then a load
  of the fresh context (what the farm's self-probe does); nothing else. The floor.
- ``child``: ``QnnRunner(warm_host=False).compile``: ``python -m workers.qnn.child compile`` per
  build (before the warm host).
- ``host``: ``QnnRunner().compile``: a job forked from the warm host per build, handed to the
  host's standby process (its heap written ahead on an idle core: workers.childproc). The host's
  own start (once per worker process) is reported apart.
- ``host-fork``: the same with ``FARM_PREFAULT_MB=0``: no standby, the job forked when it comes
  (before the standby).
- ``embedded`` (with ``--embedded``): ``farm build MODEL -t qnn:SM8650 -t qnn:SM8750`` in-process
  (``plan.build``) for each model, in a fresh FARM_HOME: the whole embedded pipeline (snapshot,
  SQL, publish), compiling the two targets in parallel where CPUs and memory allow.

Per build, ``overhead`` = the runner call's wall less the EP compile and the self-probe load,
both timed inside the process that ran them. Modes alternate round by round (loop, child, host,
loop, ...), so the box's noise falls on all of them. Prints a table; writes bench/out/host.json.

    python bench/host.py [--rounds 2] [--embedded]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.core.catalog import parse_target  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402
from workers.runner import CompileJob  # noqa: E402

MODELS = ["squeezenet", "resnet50", "inception_v1", "shufflenet", "densenet121", "inception_v2"]
TARGETS = ["qnn:SM8650", "qnn:SM8750"]

LOOP = r"""
import json, os, sys, tempfile, time
t0 = time.perf_counter()
import onnxruntime as ort, onnxruntime_qnn as oq
ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
dev = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
start = time.perf_counter() - t0
builds = []
t1 = time.perf_counter()
for model, soc in json.loads(sys.argv[1]):
    out = tempfile.mkdtemp(prefix="ctxfarm-loop-")
    so = ort.SessionOptions(); so.log_severity_level = 3
    so.add_provider_for_devices(dev, {"backend_path": oq.get_qnn_htp_path(), "soc_model": soc})
    so.add_session_config_entry("ep.context_enable", "1")
    so.add_session_config_entry("ep.context_file_path", out + "/model_ctx.onnx")
    so.add_session_config_entry("ep.context_embed_mode", "0")
    t = time.perf_counter(); ort.InferenceSession(model, so, enable_fallback=0); c = time.perf_counter() - t
    so2 = ort.SessionOptions(); so2.log_severity_level = 3
    so2.add_provider_for_devices(dev, {"backend_path": oq.get_qnn_htp_path(), "soc_model": soc})
    t = time.perf_counter(); ort.InferenceSession(out + "/model_ctx.onnx", so2, enable_fallback=0)
    builds.append({"compile": c, "load": time.perf_counter() - t})
print(json.dumps({"start": start, "total": time.perf_counter() - t1, "builds": builds}))
"""


def run_loop(plan: list[tuple[Path, Any]]) -> dict[str, Any]:
    wall = time.perf_counter()
    arg = json.dumps([[str(m), str(t.soc_model)] for m, t in plan])
    proc = subprocess.run([sys.executable, "-c", LOOP, arg], capture_output=True, text=True, check=True)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    data["process_wall"] = time.perf_counter() - wall
    for b in data["builds"]:
        b["overhead"] = 0.0
    return data


def run_runner(runner: Any, plan: list[tuple[Path, Any]]) -> dict[str, Any]:
    builds = []
    t1 = time.perf_counter()
    for model, target in plan:
        with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-") as tmp:
            t = time.perf_counter()
            out = runner.compile(CompileJob(model, target, {}, 1800, 6144, verify_load=True), Path(tmp))
            wall = time.perf_counter() - t
        load = float((out.self_load or {}).get("load_seconds") or 0.0)
        assert out.self_load and out.self_load.get("ok"), out.self_load
        builds.append({"compile": out.compile_seconds, "load": load, "wall": wall,
                       "overhead": wall - out.compile_seconds - load, **{k: v for k, v in out.timings.items()}})
    return {"total": time.perf_counter() - t1, "builds": builds}


def run_embedded(models: list[Path]) -> dict[str, Any]:
    from farm.core.settings import Settings
    from farm.pipeline.plan import build, build_jobs
    from registry.index import Registry

    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-home-") as home:
        settings = Settings.from_env({"FARM_HOME": home})
        reg = Registry.open(settings)
        try:
            builds = []
            t1 = time.perf_counter()
            for m in models:
                report = build(settings, m, TARGETS, registry=reg)
                assert all(o.state == "built" for o in report.outcomes), report.outcomes
                builds += [{"compile": o.compile_seconds or 0.0, "wall": o.wall_seconds or 0.0} for o in report.outcomes]
            total = time.perf_counter() - t1
        finally:
            reg.close()
    return {"total": total, "builds": builds, "jobs": build_jobs(settings, len(TARGETS))}


@contextmanager
def prefault_mb(value: str) -> Iterator[None]:
    """Hosts started with FARM_PREFAULT_MB=value for the block (started and warm before it)."""
    from workers.host import pool_for, shutdown
    from workers.qnn.runner import CHILD

    old = os.environ.get("FARM_PREFAULT_MB")
    os.environ["FARM_PREFAULT_MB"] = value
    shutdown()
    pool_for(CHILD).warm(1)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FARM_PREFAULT_MB")
        else:
            os.environ["FARM_PREFAULT_MB"] = old
        shutdown()
        pool_for(CHILD).warm(1)


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    over = [b["overhead"] for r in runs for b in r["builds"] if "overhead" in b]
    comp = [b["compile"] for r in runs for b in r["builds"]]
    out = {"total_median_s": statistics.median(r["total"] for r in runs),
           "ep_compile_sum_median_s": statistics.median(sum(b["compile"] for b in r["builds"]) for r in runs),
           "compile_p50_ms": statistics.median(comp) * 1000}
    if over:
        out.update(overhead_p50_ms=statistics.median(over) * 1000, overhead_mean_ms=statistics.fmean(over) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--embedded", action="store_true", help="also time in-process `farm build` of the set")
    args = ap.parse_args()
    from workers.host import pool_for
    from workers.qnn.runner import CHILD, QnnRunner

    plan = [(light(m), parse_target(t)) for m in MODELS for t in TARGETS]
    t = time.perf_counter()
    pool_for(CHILD).warm(1)
    host_start = time.perf_counter() - t
    info = {}
    with pool_for(CHILD).host() as h:
        info = dict(h.info)
    runs: dict[str, list[dict[str, Any]]] = {"loop": [], "child": [], "host-fork": [], "host": [], "embedded": []}
    cold, warm = QnnRunner(warm_host=False), QnnRunner()
    run_runner(warm, plan[:1])  # first-use costs of this process (onnx import in collect_output)
    for r in range(args.rounds):
        runs["loop"].append(run_loop(plan))
        runs["child"].append(run_runner(cold, plan))
        with prefault_mb("0"):
            runs["host-fork"].append(run_runner(warm, plan))
        runs["host"].append(run_runner(warm, plan))
        if args.embedded:
            runs["embedded"].append(run_embedded([light(m) for m in MODELS]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['total']:.2f} s" for k, v in runs.items() if v),
              file=sys.stderr)
    result: dict[str, Any] = {"builds": len(plan), "rounds": args.rounds, "cpus": os.cpu_count(),
                              "host_start_s": host_start, "host": info, "modes": {}}
    loop_total = statistics.median(r["total"] for r in runs["loop"])
    print(f"{len(plan)} builds x {args.rounds} rounds; warm host start {host_start * 1000:.0f} ms once "
          f"({info.get('threads')} threads in the host after preload)")
    print(f"{'mode':10s} {'total s':>8s} {'x loop':>7s} {'EP compile s':>12s} {'overhead p50 ms':>16s} "
          f"{'overhead mean ms':>17s}")
    for mode, rs in runs.items():
        if not rs:
            continue
        s = summary(rs)
        s["x_loop"] = s["total_median_s"] / loop_total
        result["modes"][mode] = {**s, "runs": rs}
        print(f"{mode:10s} {s['total_median_s']:8.2f} {s['x_loop']:7.2f} {s['ep_compile_sum_median_s']:12.2f} "
              f"{s.get('overhead_p50_ms', float('nan')):16.1f} {s.get('overhead_mean_ms', float('nan')):17.1f}")
    fork = [b["fork_seconds"] * 1000 for r in runs["host"] for b in r["builds"]]
    print(f"host: fork + request p50 {statistics.median(fork):.1f} ms")
    for mode in ("host-fork", "host"):
        faults = [b["page_faults"] for r in runs[mode] for b in r["builds"] if "page_faults" in b]
        if faults:
            print(f"{mode}: minor page faults during the EP compile, p50 {statistics.median(faults):.0f}, "
                  f"sum per round {sum(faults) / len(runs[mode]):.0f}")
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "host.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
