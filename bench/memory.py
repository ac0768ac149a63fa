"""Memory planning (docs/large-models.md): each build's predicted peak RSS against the one measured.

For each model, a real embedded build (QNN, SM8650) in a FARM_HOME of its own, so that the
executor predicts from the defaults (farm.pipeline.memory: measured facts, no history); the
compile child's peak (VmHWM, builds.phases ``child.peak_rss_kib``) is the measurement. Then, in
the same run, each model is predicted again from the others' measured peaks (``fit``, leave
one out): the prediction a farm with that history would make. Models: light models from the onnx
wheel and fp32 MatMul chains with external data (tests.common.big_models) of 64 MiB to 1 GiB
(``--max-mib`` for more; check ``free -g`` first, a compile peaks near 2 x its model).

Prints a table and writes bench/out/memory.json. The target: every prediction within +-25 %.

    python bench/memory.py [--max-mib 1024]
    python bench/memory.py --refit      # the last run's measurements against this code's predictions
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.core.settings import Settings  # noqa: E402
from farm.pipeline import memory, plan  # noqa: E402
from registry.index import Registry  # noqa: E402
from registry.models import Build, Model  # noqa: E402
from tests.common.big_models import matmul_chain, weight_bytes  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402

# (hidden, layers): 64 MiB, 256 MiB, 512 MiB, 1 GiB, 2 GiB of fp32 weights
CHAINS = [(1024, 2), (2048, 2), (4096, 1), (4096, 2), (4096, 4)]


def measure(model: Path, home: Path) -> dict[str, Any]:
    settings = Settings.from_env({"FARM_HOME": str(home), "FARM_BUNDLE_CACHE_MB": "0"})
    t = time.perf_counter()
    report = plan.build(settings, model, ["qnn:SM8650"])
    wall = time.perf_counter() - t
    o = report.outcomes[0]
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            b = s.get(Build, o.build_id)
            assert b is not None
            phases = dict(b.phases or {})
            m = s.get(Model, b.model_digest)
            size = int(m.size) if m is not None else 0
    finally:
        reg.close()
    return {"state": o.state, "error": o.error_code, "model_bytes": size, "wall_s": round(wall, 2),
            "ep_compile_s": round(float(phases.get("ep_compile", 0)) / 1000, 2),
            "predicted_default_mb": phases.get("predicted_peak_mb"),
            "measured_mb": round(int(phases.get(memory.PEAK_KEY) or 0) / 1024)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mib", type=int, default=1024, help="largest synthetic model, MiB of weights")
    ap.add_argument("--out", default=str(ROOT / "bench" / "out" / "memory.json"))
    ap.add_argument("--refit", action="store_true",
                    help="no compile: predict again, with this code's defaults and fit, the peaks measured by the "
                         "last run (--out)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    if args.refit:
        rows = json.loads(Path(args.out).read_text())["rows"]
        for r in rows:
            r["predicted_default_mb"] = memory.PeakModel().predict_mb(r["model_bytes"])
        report(rows, args.out, refit=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        # The onnx wheel's light models make their weights in the graph: their files (a few KiB)
        # say nothing of them. Measured and shown, left out of the fit and of the target.
        models = [(f"light_{n}", light(n)) for n in ("squeezenet", "resnet50", "vgg19")]
        for hidden, layers in CHAINS:
            if weight_bytes(hidden=hidden, layers=layers) <= args.max_mib * 2**20:
                name = f"chain_{weight_bytes(hidden=hidden, layers=layers) >> 20}MiB"
                models.append((name, matmul_chain(work / name / "model.onnx", hidden=hidden, layers=layers, seed=1)))
        for i, (name, path) in enumerate(models):
            r = {"model": name, "weights_in_graph": name.startswith("light_"), **measure(path, work / f"home-{i}")}
            rows.append(r)
            print(f"  {name}: {r}", file=sys.stderr, flush=True)
            if not name.startswith("light_"):  # give the disk back before the next one
                for f in path.parent.iterdir():
                    f.unlink()
    report(rows, args.out)
    return 0


def report(rows: list[dict[str, Any]], out: str, *, refit: bool = False) -> None:
    measured = [r for r in rows if r["measured_mb"] > 0 and not r["weights_in_graph"]]
    for r in measured:
        others = [memory.Sample(o["model_bytes"], o["measured_mb"] * 2**20) for o in measured if o is not r]
        r["predicted_fitted_mb"] = memory.fit(others).predict_mb(r["model_bytes"])
        for k in ("default", "fitted"):
            p = r[f"predicted_{k}_mb"]
            r[f"error_{k}_pct"] = round(100 * (p - r["measured_mb"]) / r["measured_mb"], 1) if p else None
    within = [abs(r["error_fitted_pct"]) <= 25 for r in measured]
    doc: dict[str, Any] = {"target": "predicted peak within +-25 % of the measured one", "rows": rows,
           "fit_all": memory.fit([memory.Sample(r["model_bytes"], r["measured_mb"] * 2**20)
                                  for r in measured]).__dict__,
           "within_25pct_fitted": f"{sum(within)}/{len(within)}",
           "within_25pct_default": f"{sum(abs(r['error_default_pct'] or 999) <= 25 for r in measured)}/{len(measured)}"}
    print(f"{'model':<22}{'MiB':>8}{'measured':>10}{'default':>9}{'err%':>7}{'fitted':>9}{'err%':>7}{'compile s':>11}")
    for r in rows:
        print(f"{r['model']:<22}{r['model_bytes'] / 2**20:>8.1f}{r['measured_mb']:>10}{r['predicted_default_mb'] or '':>9}"
              f"{r.get('error_default_pct', ''):>7}{r.get('predicted_fitted_mb', ''):>9}{r.get('error_fitted_pct', ''):>7}"
              f"{r['ep_compile_s']:>11}" + ("  (weights made in the graph)" if r["weights_in_graph"] else ""))
    print(f"within +-25 %: fitted {doc['within_25pct_fitted']}, defaults {doc['within_25pct_default']}; "
          f"fit on all: base {doc['fit_all']['base_mb']:.0f} MiB + {doc['fit_all']['ratio']:.2f} x model")
    doc["refit"] = refit  # true: predictions redone from the measured peaks of the last run, no compile
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    sys.exit(main())
