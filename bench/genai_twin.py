"""The twin check's variants on one export, against the twin as it was (measured in the same run).

The export: bench/genai_export.py (default --hidden 1024 --layers 8, 2 parts). Rows:
  - **before**: the twin as it ran until now: one child compiles the four part graphs one after
    the other, then generates (the prefill on the simulator), no part checks
    (``genai_child twin`` with no ``compiled``; the runner's old path, kept in the child);
  - **compile here**: ``run_twin`` without contexts: the parts compiled at once (one child a
    part), then the part checks and the generation;
  - **given, prefill qnn / cpu, concurrent or not**: ``run_twin(compiled=...)`` with the
    contexts ``twin_compile_part`` wrote (nothing compiled in the check), the generation's prefill
    on the simulator or on the CPU EP (``prefill_on``), the generation beside the part checks
    (``concurrent``) or after them;
  - the hand loop (bench/genai_handloop.py) for the ratio the release goal is written in.
Each row: wall seconds, the children's CPU seconds (getrusage; the box's load inflates them far
less than wall time), the phases (compile, parts check, generation), the simulator's prefill and
step, tokens compared / matched and the lowest part PSNR. Writes bench/out/genai-twin.json with
the box's load (uptime) before and after.

    .venvs/qnn-2.51.0/bin/python bench/genai_twin.py --hidden 1024 --layers 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TARGET = "qnn:SM8650"


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _row(name: str, fn: Any) -> dict[str, Any]:
    cpu, t = _children_cpu(), time.perf_counter()
    r = fn()
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    timing = r.get("timing") or {}
    twin = timing.get("twin") or {}
    worst = r.get("worst_part") or {}
    return {"variant": name, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "status": r.get("status"),
            "compile_s": timing.get("compile", r.get("compile_seconds")), "parts_check_s": timing.get("parts_check"),
            "generate_s": timing.get("generate"), "sim_prefill_s": twin.get("prefill_seconds"),
            "sim_step_s": twin.get("decode_seconds_per_token"),
            "tokens": f"{r.get('tokens_matched')}/{r.get('tokens_compared')}",
            "min_part_psnr": worst.get("psnr_db")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--budget", type=float, default=300.0, help="the accuracy budget (FARM_ACCURACY_BUDGET)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "genai-twin.json")
    ap.add_argument("--skip-before", action="store_true")
    args = ap.parse_args()

    from farm.core.catalog import parse_target
    from workers.qnn.genai import GENERATE_SHARE, run_twin, twin_compile_options, twin_compile_part
    from workers.runner import run_child

    target = parse_target(TARGET)
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bench-twin-") as tmp:
        export = Path(tmp) / "export"
        subprocess.run([sys.executable, str(ROOT / "bench" / "genai_export.py"), str(export), "--parts", "2",
                        "--hidden", str(args.hidden), "--layers", str(args.layers)], check=True, capture_output=True)
        rows: list[dict[str, Any]] = []
        t = time.perf_counter()
        hand = json.loads(subprocess.run([sys.executable, str(ROOT / "bench" / "genai_handloop.py"), str(export),
                                          str(Path(tmp) / "hand"), "--json"], check=True, capture_output=True,
                                         text=True).stdout.strip().splitlines()[-1])  # after the EP's log lines
        rows.append({"variant": "hand loop (weight-shared compiles)", "wall_s": round(time.perf_counter() - t, 2)})

        def before() -> dict[str, Any]:
            work = Path(tmp) / "before"
            work.mkdir()
            req = {"export": str(export), "work": str(work / "run"), "nice": 0,
                   "provider_options": twin_compile_options(target, {}), "tokens": 16, "min_tokens": 4,
                   "generate_seconds": args.budget / GENERATE_SHARE}
            r, _, _ = run_child("workers.qnn.genai_child", "twin", req, work, timeout=args.budget)
            return {**r, "timing": {**r.get("timing", {}), "compile": r.get("compile_seconds")}}

        if not args.skip_before:
            rows.append(_row("before: compiles in series, then generation (prefill on the simulator)", before))
        rows.append(_row("compile here (parts at once), part checks + generation, prefill qnn",
                         lambda: run_twin(export, target, {}, Path(tmp) / "here", nice=0, timeout=args.budget)))
        files: dict[str, str] = {}
        t = time.perf_counter()
        for i in range(2):
            files.update(twin_compile_part(export, i, target, {}, Path(tmp) / "ctx" / f"part{i}", nice=0)["files"])
        rows.append({"variant": "twin_compile_part x2, one after the other (a farm build's jobs)",
                     "wall_s": round(time.perf_counter() - t, 2)})
        for prefill_on in ("qnn", "cpu"):
            for concurrent in (True, False):
                name = (f"given contexts, prefill {prefill_on}, generation "
                        f"{'beside the part checks' if concurrent else 'after them'}")
                rows.append(_row(name, lambda p=prefill_on, c=concurrent, n=name: run_twin(
                    export, target, {}, Path(tmp) / n.replace(" ", "-").replace(",", ""), nice=0,
                    timeout=args.budget, compiled=files, prefill_on=p, concurrent=c)))
    doc = {"export": {"hidden": args.hidden, "layers": args.layers, "parts": 2}, "cpus": len(os.sched_getaffinity(0)),
           "hand_loop": hand, "rows": rows, "load_before": load_before, "load_after": _load()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    base = next((r["wall_s"] for r in rows if r["variant"].startswith("before")), None)
    keys = ["wall_s", "cpu_s", "compile_s", "parts_check_s", "generate_s", "sim_prefill_s", "sim_step_s", "tokens",
            "min_part_psnr"]
    print(f"{'variant':86s} " + " ".join(f"{k:>13s}" for k in keys) + "   x before")
    for r in rows:
        ratio = f"{r['wall_s'] / base:.2f}x" if base and "cpu_s" in r else ""
        print(f"{r['variant'][:86]:86s} " + " ".join(f"{str(r.get(k, '')):>13s}" for k in keys) + f"   {ratio}")
    print(f"load: {load_before} -> {doc['load_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
