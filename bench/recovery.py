"""Recovery times with the DEFAULT lease and heartbeat (60 s / 10 s), on real services.

    python bench/recovery.py [--lease 60] [--heartbeat 10]

1. dead worker mid-compile: two 2.51.0 workers; the one compiling light_vgg19 is SIGKILLed;
   time until the other starts attempt 2 (the build row is running again);
2. dead worker after taking the message, before claiming it (CTXFARM_TEST_PAUSE_BEFORE_EXECUTE);
   time until the other worker runs the build;
3. SIGTERM of an embedded `farm build` mid-compile; time until the next `farm build` of the same
   model and target is compiling.
Prints a table and writes bench/out/recovery.json. The bounds it compares with are derived
from the settings (lease + heartbeat; 3 heartbeats), measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.devfarm.launcher import services, wait_live  # noqa: E402
from tests.common.onnx_models import light  # noqa: E402
from tests.common.procs import compile_children, wait_for  # noqa: E402


def build_row(env: dict[str, str]) -> dict[str, Any]:
    from sqlalchemy import select

    from farm.core.settings import Settings
    from registry.index import Registry
    from registry.models import Build

    reg = Registry.open(Settings.from_env({**os.environ, **env}))
    try:
        with reg.db.session() as s:
            b = s.scalars(select(Build).order_by(Build.id.desc())).first()
            return {} if b is None else {"state": b.state, "attempts": b.attempts, "code": b.error_code}
    finally:
        reg.close()


def worker(env: dict[str, str], log: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    exe = ROOT / ".venvs" / "qnn-2.51.0" / "bin" / "farm"
    return subprocess.Popen([str(exe), "worker"], env={**os.environ, **env, **(extra or {})}, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm.cli", *args], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600, check=True)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def dead_mid_compile(env: dict[str, str], tmp: Path) -> float:
    a, b = worker(env, tmp / "a.log"), worker(env, tmp / "b.log")
    try:
        wait_live(env, 2)
        cli(env, "submit", str(light("vgg19")), "-t", "qnn:SM8650", "--sdk", "2.51.0")
        holder = wait_for(lambda: next((w for w in (a, b) if compile_children(w.pid)), None), 120)
        assert holder is not None
        killed = time.monotonic()
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        assert wait_for(lambda: build_row(env).get("attempts") == 2 and build_row(env)["state"] == "running",
                        300, poll=0.2)
        return time.monotonic() - killed
    finally:
        stop([a, b])


def dead_before_claim(env: dict[str, str], tmp: Path) -> float:
    import redis

    a = worker(env, tmp / "p.log", {"CTXFARM_TEST_PAUSE_BEFORE_EXECUTE": "600"})
    procs = [a]
    try:
        wait_live(env, 1)
        cli(env, "submit", str(light("squeezenet")), "-t", "qnn:SM8650", "--sdk", "2.51.0")
        r = redis.Redis.from_url(env["FARM_BROKER_URL"])
        assert wait_for(lambda: r.llen("compile.qnn.2.51.0") == 0, 60)
        procs.append(worker(env, tmp / "q.log"))
        wait_live(env, 2)
        killed = time.monotonic()
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        assert wait_for(lambda: build_row(env).get("state") in ("running", "succeeded"), 300, poll=0.2)
        return time.monotonic() - killed
    finally:
        stop(procs)


def sigterm_embedded(tmp: Path) -> float:
    env = {"FARM_HOME": str(tmp / "embedded")}
    full = {**os.environ, **env}
    for k in ("FARM_DATABASE_URL", "FARM_STORE_URL", "FARM_BROKER_URL"):
        full.pop(k, None)
    first = subprocess.Popen([sys.executable, "-m", "farm.cli", "build", str(light("vgg19")), "-t", "qnn:SM8650"],
                             env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: compile_children(first.pid), 60)
    first.send_signal(signal.SIGTERM)
    first.wait()
    t0 = time.monotonic()
    nxt = subprocess.Popen([sys.executable, "-m", "farm.cli", "build", str(light("vgg19")), "-t", "qnn:SM8650"],
                           env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: compile_children(nxt.pid), 60, poll=0.01)
    took = time.monotonic() - t0
    nxt.wait()
    return took


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lease", type=float, default=60.0)
    ap.add_argument("--heartbeat", type=float, default=10.0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ctxfarm-recovery-") as d:
        tmp = Path(d)
        with services(tmp / "svc", keep=False) as env:
            from registry.db import migrate

            migrate(env["FARM_DATABASE_URL"])
            env = {**env, "FARM_LEASE_SECONDS": f"{args.lease:g}", "FARM_HEARTBEAT_SECONDS": f"{args.heartbeat:g}"}
            mid = dead_mid_compile(env, tmp)
            rows.append(("worker SIGKILLed mid-compile -> attempt 2 running", mid, args.lease + args.heartbeat))
        with services(tmp / "svc2", keep=False) as env:
            from registry.db import migrate

            migrate(env["FARM_DATABASE_URL"])
            env = {**env, "FARM_LEASE_SECONDS": f"{args.lease:g}", "FARM_HEARTBEAT_SECONDS": f"{args.heartbeat:g}"}
            before = dead_before_claim(env, tmp)
            rows.append(("worker killed after taking the message -> build running", before, 4 * args.heartbeat))
        term = sigterm_embedded(tmp)
        rows.append(("SIGTERM of farm build -> next farm build compiling", term, 0.0))
    print(f"{'scenario':58s} {'measured s':>10s} {'bound s':>8s}")
    for name, took, bound in rows:
        print(f"{name:58s} {took:10.1f} {bound:8.0f}" if bound else f"{name:58s} {took:10.2f} {'(none)':>8s}")
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "recovery.json").write_text(json.dumps([{"scenario": n, "seconds": t, "bound": b} for n, t, b in rows],
                                                  indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
