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
    return 0
