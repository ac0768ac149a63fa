"""The hand loop: what an engineer does without the farm to get an LLM export's context binaries.
Each part's prefill and decode graph compiled weight-shared with onnxruntime-qnn in one process
(``ep.share_ep_contexts=1`` on both, ``ep.stop_share_ep_contexts=1`` on the second), one part
after the other, one SoC. No farm code: the baseline bench/genai.py measures the farm against.

    python bench/genai_handloop.py EXPORT OUT [--soc-model 57] [--json]

Prints the wall time of each part and of the whole loop (imports and EP registration included:
the farm's figure counts them too); ``--json`` prints them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

START = time.perf_counter()
PAIR = re.compile(r"(context|iterator)_(\d{1,3})\.onnx")


def parts_of(export: Path) -> list[tuple[Path, Path]]:
    """(prefill, decode) per part, by the Olive recipe's names (bench/genai_export.py writes them)."""
    found: dict[int, dict[str, Path]] = {}
    for f in export.iterdir():
        m = PAIR.fullmatch(f.name)
        if m:
            found.setdefault(int(m.group(2)), {})[m.group(1)] = f
    return [(found[i]["context"], found[i]["iterator"]) for i in sorted(found)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--soc-model", default="57", help="SM8650's QNN soc_model id")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import onnxruntime as ort
    import onnxruntime_qnn as oq

    ort.register_execution_provider_library("QNNExecutionProvider", oq.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
    options = {"backend_path": oq.get_qnn_htp_path(), "soc_model": args.soc_model,
               "htp_graph_finalization_optimization_mode": "0"}
    parts: list[dict[str, Any]] = []
    for i, (prefill, decode) in enumerate(parts_of(args.export)):
        t = time.perf_counter()
        out = args.out / f"part{i}"
        out.mkdir(parents=True, exist_ok=True)
        os.chdir(args.export)  # external data resolves beside the graph
        for k, graph in enumerate((prefill, decode)):
            so = ort.SessionOptions()
            so.add_provider_for_devices(devices, options)
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if k == 1:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
            ort.ModelCompiler(so, graph.name, embed_compiled_data_into_model=False).compile_to_file(
                str(out / f"{graph.stem}_ctx.onnx"))
        parts.append({"part": i, "wall_s": round(time.perf_counter() - t, 3),
                      "binaries": sorted(p.name for p in out.glob("*.bin"))})
    doc = {"wall_s": round(time.perf_counter() - START, 3), "parts": parts, "onnxruntime": ort.__version__}
    if args.json:
        print(json.dumps(doc))
    else:
        for p in parts:
            print(f"part {p['part']}: {p['wall_s']:.1f} s ({', '.join(p['binaries'])})")
        print(f"hand loop: {doc['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
