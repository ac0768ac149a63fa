"""A real `farm serve` for tests and benchmarks (started and stopped by PID), and tokens."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from farm.core.settings import Settings


def serve(env: dict[str, str], port: int, log: Path, *, timeout: float = 60.0,
          workers: int | None = 1) -> subprocess.Popen[bytes]:
    """`farm serve` on ``port`` with ``env``; returns once /healthz answers. ``workers``: its
    processes (one unless asked; None: the service's own default)."""
    argv = [sys.executable, "-m", "farm.cli", "serve", "--port", str(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    proc = subprocess.Popen(argv, env=env,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)  # a refused connect costs nothing: ask often, start the test sooner
    proc.kill()
    proc.wait()
    raise AssertionError(f"farm serve did not answer: {log.read_text()[-3000:]}")


def token(settings: Settings, name: str, scope: str) -> str:
    """A new token in the registry of ``settings``."""
    from registry.index import Registry
    from registry.tokens import create_token

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            return create_token(s, name, scope)
    finally:
        reg.close()
