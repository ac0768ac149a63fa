"""Probes and device reads while a flood of long polls waits, baseline in the same run.

    python bench/longpoll.py [--polls 48] [--wait 15] [--rounds 5] [--code DIR]

Starts a private Redis and a real `farm serve` (with a broker and no worker, so a queued
release stays queued), times /healthz, /readyz, /v1/resolve and a plain release GET with no
long poll waiting (the baseline), then with ``--polls`` long polls waiting on that release
(raw sockets, from two read tokens), and prints the ratio. ``--code DIR`` runs the service from
another checkout (e.g. ``git archive <commit> | tar -x -C DIR``) to measure the code before a
change against the same client. Writes bench/out/longpoll.json (``--out NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.devfarm.services import free_port, start_redis  # noqa: E402
from tests.common.service import serve, token  # noqa: E402


def get(url: str, tok: str | None, timeout: float) -> tuple[int, float]:
    started = time.perf_counter()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {tok}"} if tok else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError:
        status = 0
    return status, time.perf_counter() - started


def probes(url: str, read: str, release: int, timeout: float) -> dict[str, float]:
    out = {}
    for name, path, tok in (("healthz", "/healthz", None), ("readyz", "/readyz", None),
                            ("resolve", "/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", read),
                            ("release", f"/v1/releases/{release}", read)):
        status, seconds = get(url + path, tok, timeout)
        out[name] = seconds if status == 200 else float("inf")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--polls", type=int, default=48)
    ap.add_argument("--wait", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--code", type=Path, default=None, help="run the service from this checkout")
    ap.add_argument("--out", default="longpoll", help="bench/out/NAME.json")
    args = ap.parse_args()

    from farm.core.settings import Settings
    from farm.pipeline.plan import build
    from tests.common.onnx_models import light

    with tempfile.TemporaryDirectory(prefix="ctxfarm-longpoll-") as tmp_s:
        tmp = Path(tmp_s)
        redis = start_redis(tmp / "redis")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        env.update({"FARM_HOME": str(tmp / "home"), "FARM_BROKER_URL": redis.url})
        if args.code:
            env["PYTHONPATH"] = str(args.code.resolve())
        proc = None
        try:
            build(Settings.from_env({"FARM_HOME": env["FARM_HOME"]}), light("squeezenet"), ["qnn:SM8650"],
                  name="sq", tag="stable")
            settings = Settings.from_env(env)
            read1, read2, sub = (token(settings, n, s) for n, s in (("r1", "read"), ("r2", "read"), ("s", "submit")))
            port = free_port()
            here = os.getcwd()
            os.chdir(args.code or ROOT)  # `python -m farm.cli` imports from its working directory first
            try:
                proc = serve(env, port, tmp / "serve.log")
            finally:
                os.chdir(here)
            url = f"http://127.0.0.1:{port}"
            req = urllib.request.Request(url + "/v1/releases", method="POST", data=json.dumps({
                "model": "sq:stable", "targets": ["qnn:SM8750"], "sdks": ["2.51.0"], "allow_queue": True}).encode(),
                headers={"Authorization": f"Bearer {sub}", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                release = int(json.loads(resp.read())["release"])

            rows: list[dict[str, Any]] = []
            for r in range(args.rounds):
                idle = probes(url, read1, release, args.wait * 3)
                socks = []
                for i in range(args.polls):
                    s = socket.create_connection(("127.0.0.1", port), timeout=10)
                    s.sendall(f"GET /v1/releases/{release}?wait={args.wait} HTTP/1.1\r\nHost: x\r\n"
                              f"Authorization: Bearer {read1 if i % 2 else read2}\r\n\r\n".encode())
                    socks.append(s)
                time.sleep(1.0)  # let the service take them all
                flooded = probes(url, read1, release, args.wait * 3)
                for s in socks:
                    s.close()
                time.sleep(args.wait if r + 1 < args.rounds and args.code else 0.5)  # old code: let the pool drain
                rows.append({"round": r, "idle": idle, "flood": flooded})
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
            redis.stop()

    names = ("healthz", "readyz", "resolve", "release")
    summary = {}
    print(f"{'probe':10s} {'idle p50 ms':>12s} {'flood p50 ms':>13s} {'flood max ms':>13s} {'ratio':>8s}")
    for n in names:
        idle = sorted(r["idle"][n] for r in rows)
        flood = sorted(r["flood"][n] for r in rows)
        p50_i, p50_f = idle[len(idle) // 2], flood[len(flood) // 2]
        summary[n] = {"idle_p50_s": p50_i, "flood_p50_s": p50_f, "flood_max_s": flood[-1], "ratio": p50_f / p50_i}
        print(f"{n:10s} {p50_i * 1000:12.1f} {p50_f * 1000:13.1f} {flood[-1] * 1000:13.1f} {p50_f / p50_i:8.2f}")
    out = ROOT / "bench" / "out" / f"{args.out}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"polls": args.polls, "wait_s": args.wait, "rounds": rows, "summary": summary,
                               "code": str(args.code) if args.code else "this checkout"}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
