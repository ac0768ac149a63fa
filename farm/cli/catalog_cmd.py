"""farm targets"""

from __future__ import annotations

import argparse
import json
from typing import Any

from farm.cli import table
from farm.core.catalog import BACKENDS, load_catalog
from farm.core.settings import Settings


def add_arguments(name: str, p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, help="only this backend")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(name: str, args: argparse.Namespace, settings: Settings) -> int:
    targets = [t for t in load_catalog().targets if not args.backend or t.backend == args.backend]
    rows: list[dict[str, Any]] = [{"target": t.ref, "backend": t.backend, "soc_model": t.soc_model, "htp_arch": t.htp_arch,
             "compute_capability": t.compute_capability, "name": t.marketing, "aliases": list(t.aliases)}
            for t in targets]
    if args.json:  # schema: farm/cli/schemas/targets.json
        print(json.dumps(rows, indent=2))
    else:
        table([{**r, "aliases": ", ".join(r["aliases"])} for r in rows],
              ["target", "soc_model", "htp_arch", "compute_capability", "name", "aliases"])
        if args.backend in (None, "qnn"):
            from farm.core.catalog.runtimes import qnn_runtimes

            # What a device's --qnn is: the QNN SDK inside the onnxruntime-qnn release it installed.
            print("\nQNN runtime on a device = the SDK inside its onnxruntime-qnn release:")
            table([{"onnxruntime-qnn": r.version, "QNN SDK": r.sdk, "onnxruntime": r.onnxruntime}
                   for r in qnn_runtimes()], ["onnxruntime-qnn", "QNN SDK", "onnxruntime"])
    return 0
