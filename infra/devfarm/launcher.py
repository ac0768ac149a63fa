"""``python -m infra.devfarm``: bring up a local farm (services, one worker per QNN SDK venv, the
HTTP service). A dead worker is reported and restarted; Ctrl-C or SIGTERM stops everything.

Used by ``infra/farm-up.sh`` and ``bench/farm.py``. Every process started here is stopped here,
by PID.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra.devfarm.services import Service, free_port, reachable, start_postgres, start_redis, start_seaweedfs

ROOT = Path(__file__).resolve().parents[2]


def worker_venvs() -> list[Path]:
    return sorted(p for p in (ROOT / ".venvs").glob("qnn-*") if (p / "bin" / "farm").exists())


@contextmanager
def services(base: Path, *, keep: bool = True) -> Iterator[dict[str, str]]:
    """FARM_* settings for a farm on real services under ``base``; ``keep=False`` drops the
    PostgreSQL database at the end (benchmarks)."""
    started: list[Service] = []
    dropped: list[str] = []
    try:
        base.mkdir(parents=True, exist_ok=True)
        redis = start_redis(base / "redis", persist=True)
        started.append(redis)
        if reachable("127.0.0.1", 5432):
            import hashlib

            import psycopg

            # One database per farm dir, kept across restarts like the dir's Redis and blobs.
            name = "ctxfarm_dev_" + hashlib.sha1(str(base.resolve()).encode()).hexdigest()[:10]
            with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                    c.execute(f'CREATE DATABASE "{name}"')
            if not keep:
                dropped.append(name)
            db_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        else:
            pg = start_postgres(base / "pg")
            started.append(pg)
            db_url = pg.url
        s3 = start_seaweedfs(base / "seaweedfs")
        started.append(s3)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "ctxfarm")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "ctxfarm-secret")
        yield {"FARM_HOME": str(base / "home"), "FARM_DATABASE_URL": db_url, "FARM_BROKER_URL": redis.url,
               "FARM_STORE_URL": f"s3://ctxfarm/registry?endpoint={s3.url}",
               "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
               "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}
    finally:
        for svc in reversed(started):
            svc.stop()
        for name in dropped:
            import psycopg

            with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def workers(env: dict[str, str], venvs: list[Path], log_dir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for v in venvs:
            log = open(log_dir / f"worker-{v.name}.log", "wb")
            procs.append(subprocess.Popen([str(v / "bin" / "farm"), "worker"], env={**os.environ, **env},
                                          stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def wait_live(env: dict[str, str], n: int, timeout: float = 90) -> None:
    from farm.core.settings import Settings
    from registry.index import Registry, live_workers

    settings = Settings.from_env({**os.environ, **env})
    reg = Registry.open(settings)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with reg.db.session() as s:
                if len(live_workers(s, stale_after=settings.worker_stale_after)) >= n:
                    return
            time.sleep(0.5)
    finally:
        reg.close()
    raise SystemExit(f"only some of the {n} workers came up; see their logs")


MAX_RESTARTS = 3


@contextmanager
def api(env: dict[str, str], port: int, log_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`farm serve` on the farm's settings (stopped by its PID)."""
    log = open(log_dir / "api.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
                            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not reachable("127.0.0.1", port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"farm serve did not start: {(log_dir / 'api.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class Stops:
    """Ctrl-C and SIGTERM stop the farm (a KeyboardInterrupt), except inside ``held()``, which
    raises it on leaving instead."""

    def __init__(self) -> None:
        self.holding = False
        self.pending = False

    def on_signal(self, _sig: int, _frame: Any) -> None:
        if self.holding:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                self.pending = False
                raise KeyboardInterrupt


STOPS = Stops()


def supervise(env: dict[str, str], venvs: list[Path], procs: list[subprocess.Popen[bytes]], log_dir: Path,
              stop: Any) -> None:
    """Until ``stop`` is set: a worker that died is reported and restarted (at most MAX_RESTARTS
    times each; then it is reported as given up)."""
    restarts = [0] * len(procs)
    while not stop.wait(1.0):
        for i, p in enumerate(procs):
            if p.poll() is None or restarts[i] < 0:
                continue
            v = venvs[i]
            if restarts[i] >= MAX_RESTARTS:
                print(f"worker {v.name} died {MAX_RESTARTS + 1} times (exit {p.returncode}); not restarting: "
                      f"see {log_dir / f'worker-{v.name}.log'}", file=sys.stderr, flush=True)
                restarts[i] = -1
                continue
            restarts[i] += 1
            print(f"worker {v.name} died (exit {p.returncode}); restarting ({restarts[i]}/{MAX_RESTARTS})",
                  file=sys.stderr, flush=True)
            log = open(log_dir / f"worker-{v.name}.log", "ab")
            # A stop waits until the new worker is in procs: one landing between its start and the
            # assignment left it running after the farm stopped (a blocked signal mask would be
            # inherited by the worker: the stop is held back in Python instead).
            with STOPS.held():
                procs[i] = subprocess.Popen([str(v / "bin" / "farm"), "worker"], env={**os.environ, **env},
                                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)


TOKEN_NAME, TOKEN_SCOPE = "farm-up", "submit"


def farm_token(env: dict[str, str], base: Path) -> str:
    """The farm's own submit token, for the exports: the one kept in ``base/token`` while the
    index still knows it (the database outlives a farm-up unless --ephemeral), else a new one."""
    from farm.core.settings import Settings
    from registry.index import Registry
    from registry.tokens import create_token, list_tokens, revoke_token, scope_of

    kept = base / "token"
    settings = Settings.from_env({**os.environ, **env})
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            old = kept.read_text().strip() if kept.exists() else ""
            if old and scope_of(s, old) == TOKEN_SCOPE:
                return old
            # The one whose file was lost can never be used again: revoked (names stay taken).
            for t in list_tokens(s):
                if t.name.startswith(TOKEN_NAME) and t.revoked_at is None:
                    revoke_token(s, t.name)
            token = create_token(s, f"{TOKEN_NAME}-{time.strftime('%Y%m%d-%H%M%S')}", TOKEN_SCOPE)
    finally:
        reg.close()
    kept.touch(mode=0o600)
    kept.write_text(token + "\n")
    return token


def main() -> int:
    import json
    import threading

    ap = argparse.ArgumentParser(prog="infra/farm-up.sh", description=__doc__)
    ap.add_argument("--dir", default=str(ROOT / ".farm"), help="where the farm keeps its data and logs")
    ap.add_argument("--api-port", type=int, default=8080, help="farm serve's port (0: a free one)")
    ap.add_argument("--ephemeral", action="store_true",
                    help="drop the farm's PostgreSQL database when it stops (by default it is kept: the next "
                         "farm-up finds the same models, artifacts and tokens)")
    args = ap.parse_args()
    venvs = worker_venvs()
    if not venvs:
        print("no worker venvs: run infra/workers/create-venvs.sh", file=sys.stderr)
        return 1

    # SIGTERM stops the farm exactly as Ctrl-C does: everything started here, by PID.
    signal.signal(signal.SIGTERM, STOPS.on_signal)
    signal.signal(signal.SIGINT, STOPS.on_signal)
    base = Path(args.dir)
    try:
        with services(base, keep=not args.ephemeral) as env:
            from registry.db import migrate

            migrate(env["FARM_DATABASE_URL"])
            token = farm_token(env, base)
            port = args.api_port or free_port()
            with workers(env, venvs, base) as procs, api(env, port, base) as server:
                wait_live(env, len(venvs))
                env_out = {**env, "FARM_SERVER": f"http://127.0.0.1:{port}", "FARM_TOKEN": token}
                info = base / "farm.json"
                info.touch(mode=0o600)  # it holds the token
                info.write_text(json.dumps({"env": env_out, "api_pid": server.pid,
                                            "worker_pids": [p.pid for p in procs]}, indent=2))
                print("farm is up; in another shell:")
                for k, v in env_out.items():
                    print(f"  export {k}='{v}'")
                print(f"  farm workers   # {len(venvs)} workers: " + ", ".join(v.name for v in venvs))
                print(f"  # FARM_TOKEN: this farm's {TOKEN_SCOPE} token (also in {base / 'token'}); "
                      "a device's: farm token create NAME --scope read")
                print("  " + ("--ephemeral: the database is dropped when the farm stops" if args.ephemeral else
                              f"the database is kept when the farm stops ({base}); --ephemeral drops it"))
                print("Ctrl-C or SIGTERM stops the farm.", flush=True)
                stop = threading.Event()
                try:
                    supervise(env, venvs, procs, base, stop)
                finally:
                    stop.set()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
