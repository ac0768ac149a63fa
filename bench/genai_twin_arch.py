"""Whether a genai twin compiled for one SoC stands for the other SoCs of its HTP arch: the
evidence behind keying twin builds by the arch (``farm.pipeline.genai.twin_builds.twin_spec``).

An export of bench/genai_export.py (2 parts); each part's twin (prefill and decode compiled
without sharing, ``workers.qnn.genai.twin_compile_part``) compiled for each SoC of ``--socs``,
then two tables:
  - **graphs**: each part graph of each SoC's twin run on the simulator with the inputs of the
    twin's part check (the CPU EP's values before it, the CPU prefill's KV cache for the decode):
    whether every output is bit for bit the first SoC's, the largest difference, the lowest PSNR
    against the CPU EP;
  - **check**: the twin check of a package for ``--package`` (``workers.qnn.genai.run_twin``
    with the contexts given, as a farm build runs it) on each SoC's twin: the lowest part PSNR,
    tokens matched, the largest logit error (the generation runs beside the part checks for as
    long as they take, so the count of tokens compared varies).
Writes bench/out/genai-twin-arch.json.

    python bench/genai_twin_arch.py --hidden 256 --layers 4 --socs SM8550,SC8380XP,QCS9100,SM8450
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _graph_rows(export_dir: Path, files: dict[str, dict[str, str]], socs: list[str]) -> list[dict[str, Any]]:
    import numpy as np
    import onnxruntime as ort

    from farm.core import genai
    from workers.qnn.accuracy import compare
    from workers.qnn.child import _session_options
    from workers.qnn.genai_child import _cpu_run, _present_as_past, _prompt_ids, part_feeds, part_inputs

    export = genai.read_export(export_dir)
    with tempfile.TemporaryDirectory() as tmp:
        ids = _prompt_ids(export, Path(tmp), genai.TWIN_PROMPT)
    pad = export.config.get("model", {}).get("pad_token_id")
    rows = []
    for p in export.parts:
        pre_in, dec_in, n = part_inputs(export, p.index, ids, pad if isinstance(pad, int) else None)
        pre_feeds = part_feeds(export, p, "prefill", pre_in, n, None)
        ref_pre = _cpu_run(export, p.prefill.graph.file, pre_feeds)
        dec_feeds = part_feeds(export, p, "decode", dec_in, n, _present_as_past(export, p, ref_pre))
        ref_dec = _cpu_run(export, p.decode.graph.file, dec_feeds)
        for kind, feeds, ref, st in (("prefill", pre_feeds, ref_pre, p.prefill), ("decode", dec_feeds, ref_dec,
                                                                                   p.decode)):
            got = {}
            for soc in socs:
                _, so = _session_options({})  # as the part check loads a twin: no soc_model
                so.log_severity_level = 3
                sess = ort.InferenceSession(files[soc][st.name], so)
                names = [o.name for o in sess.get_outputs()]
                got[soc] = dict(zip(names, sess.run(names, feeds), strict=True))
                del sess
            first = got[socs[0]]
            for soc in socs:
                outs = st.graph.output_names
                rows.append({"part": p.index, "graph": kind, "soc": soc,
                             "bitwise_equal_to_first": all(np.array_equal(got[soc][k], first[k]) for k in outs),
                             "max_abs_diff": max(float(np.max(np.abs(got[soc][k].astype(np.float64)
                                                                      - first[k].astype(np.float64)))) for k in outs),
                             "min_psnr_db": min(round(compare(ref[k], got[soc][k])["psnr_db"], 3) for k in outs)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None)
    ap.add_argument("--socs", default="SM8550,SC8380XP,QCS9100,SM8450", help="the first is the others' reference")
    ap.add_argument("--package", default="SC8380XP", help="the SoC of the package whose twin check runs")
    ap.add_argument("--vtcm-mb", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "genai-twin-arch.json")
    args = ap.parse_args()

    from farm.core.catalog import load_catalog
    from workers.qnn.genai import run_twin, twin_compile_part

    cat = load_catalog()
    socs = [s.strip() for s in args.socs.split(",") if s.strip()]
    options: dict[str, Any] = {"graph_optimization": 1, **({"vtcm_mb": args.vtcm_mb} if args.vtcm_mb else {})}
    with tempfile.TemporaryDirectory(prefix="ctxfarm-twin-arch-") as tmp:
        export_dir = Path(tmp) / "export"
        argv = [sys.executable, str(ROOT / "bench" / "genai_export.py"), str(export_dir), "--parts", "2",
                "--hidden", str(args.hidden), "--layers", str(args.layers)]
        if args.kv_heads:
            argv += ["--kv-heads", str(args.kv_heads)]
        subprocess.run(argv, check=True, capture_output=True)
        files: dict[str, dict[str, str]] = {}
        binaries: dict[str, dict[str, Any]] = {}
        for soc in socs:
            files[soc] = {}
            for i in range(2):
                r = twin_compile_part(export_dir, i, cat.get(soc, backend="qnn"), options,
                                      Path(tmp) / "twins" / soc / f"part{i}", nice=0)
                files[soc].update(r["files"])
            binaries[soc] = {b.name: {"size": b.stat().st_size,
                                      "sha256": hashlib.sha256(b.read_bytes()).hexdigest()[:16]}
                             for b in sorted((Path(tmp) / "twins" / soc).glob("part*/*.bin"))}
        graphs = _graph_rows(export_dir, files, socs)
        package = cat.get(args.package, backend="qnn")
        checks = []
        for soc in socs:
            r = run_twin(export_dir, package, {}, Path(tmp) / "check" / soc, compiled=files[soc], nice=0, timeout=600)
            worst = r.get("worst_part") or {}
            checks.append({"package": package.name, "twin_compiled_for": soc, "status": r.get("status"),
                           "min_part_psnr_db": worst.get("psnr_db"),
                           "part_psnr": [{ph: p.get(ph) for ph in ("prefill", "decode")} for p in r.get("parts") or []],
                           "tokens": f"{r.get('tokens_matched')}/{r.get('tokens_compared')}",
                           "max_logit_error": r.get("max_logit_error")})
    first = checks[0]["part_psnr"]
    for c in checks:
        c["part_psnr_equal_to_first"] = c.pop("part_psnr") == first
    doc = {"export": {"hidden": args.hidden, "layers": args.layers, "kv_heads": args.kv_heads, "parts": 2},
           "options": options, "socs": {s: cat.get(s, backend="qnn").htp_arch for s in socs},
           "binaries": binaries, "graphs": graphs, "checks": checks}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{'part':>4s} {'graph':8s} {'soc':10s} {'arch':5s} {'bitwise = ' + socs[0]:>20s} {'max |diff|':>12s} "
          f"{'min PSNR dB':>12s}")
    for g in graphs:
        print(f"{g['part']:>4d} {g['graph']:8s} {g['soc']:10s} {doc['socs'][g['soc']]:5s} "
              f"{str(g['bitwise_equal_to_first']):>20s} {g['max_abs_diff']:>12.6g} {g['min_psnr_db']:>12.3f}")
    print(f"\n{'package':10s} {'twin for':10s} {'status':8s} {'min part PSNR':>14s} {'PSNR = first':>13s} "
          f"{'tokens':>8s} {'max logit err':>14s}")
    for c in checks:
        print(f"{c['package']:10s} {c['twin_compiled_for']:10s} {str(c['status']):8s} {c['min_part_psnr_db']!s:>14s} "
              f"{c['part_psnr_equal_to_first']!s:>13s} {c['tokens']:>8s} {c['max_logit_error']!s:>14s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
