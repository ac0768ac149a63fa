"""Archive bombs against the service's unpacking (farm.api.uploads), baseline in the same run.

    python bench/uploads.py [--expand-mib 256] [--rounds 3]

For each accepted compressed format, a tar whose one member expands to ``--expand-mib`` MiB of
zeros (a few hundred bytes to a few hundred KiB uploaded), under a 1 MiB upload cap: the time
``unpack`` takes to refuse it, against the time to read the same archive's members whole with
``tarfile.open(..., "r:*").getmembers()`` (what unpacking did before it streamed: its cost grew
with the expansion). Prints a table, writes bench/out/uploads.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from farm.api import uploads  # noqa: E402
from farm.core.errors import InvalidModelError  # noqa: E402
from tests.unit.farm.test_uploads import COMPRESSORS, _compressed_tar  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--expand-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ctxfarm-bombs-") as tmp_s:
        tmp = Path(tmp_s)
        for fmt in sorted(COMPRESSORS):
            bomb = tmp / f"bomb.{fmt}"
            bomb.write_bytes(_compressed_tar(COMPRESSORS[fmt], args.expand_mib << 20))
            refused, whole = [], []
            for r in range(args.rounds):
                dest = tmp / f"{fmt}-{r}"
                dest.mkdir()
                t0 = time.perf_counter()
                try:
                    uploads.unpack(bomb, "application/x-tar", dest, max_bytes=1 << 20)
                    raise SystemExit(f"{fmt}: the bomb was accepted")
                except InvalidModelError:
                    refused.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                with tarfile.open(bomb, "r:*") as tar:
                    tar.getmembers()
                whole.append(time.perf_counter() - t0)
            r_med, w_med = sorted(refused)[len(refused) // 2], sorted(whole)[len(whole) // 2]
            rows.append({"format": fmt, "uploaded_bytes": bomb.stat().st_size, "expands_mib": args.expand_mib,
                         "refused_s": r_med, "read_whole_s": w_med, "ratio": w_med / r_med})
    print(f"{'format':8s} {'uploaded':>10s} {'expands':>9s} {'refused ms':>11s} {'read whole ms':>14s} {'x':>8s}")
    for r in rows:
        print(f"{r['format']:8s} {r['uploaded_bytes']:10d} {r['expands_mib']:7d} M {r['refused_s'] * 1000:11.2f} "
              f"{r['read_whole_s'] * 1000:14.1f} {r['ratio']:8.0f}")
    out = ROOT / "bench" / "out" / "uploads.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "cap_bytes": 1 << 20, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
