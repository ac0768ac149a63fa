"""Run the real `farm` CLI in a subprocess, as users and pipelines do."""

from __future__ import annotations

import subprocess
import sys

# What the CLI's fast paths must not import (their start-up budget): checked with -X importtime.
HEAVY = ("sqlalchemy", "alembic", "onnx", "onnxruntime", "onnxruntime_qnn", "numpy", "boto3", "botocore", "psycopg",
         "importlib.metadata")


def farm(env: dict[str, str], *args: str, check: bool = True, timeout: float = 300,
         importtime: bool = False) -> subprocess.CompletedProcess[str]:
    """``python -m farm.cli ARGS``; ``importtime``: with ``-X importtime`` (read stderr with ``modules``)."""
    argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "farm.cli", *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"farm {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def farm_many(env: dict[str, str], argvs: list[list[str]], *, workers: int = 2,
              timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """``farm(env, *argv, check=False)`` for each of ``argvs``, ``workers`` at a time (each call is
    its own process: a usage error's start-up is CPU-bound), answers in the order asked. Only for
    calls that do not depend on each other's effects."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda argv: farm(env, *argv, check=False, timeout=timeout), argvs))


def modules(stderr: str) -> set[str]:
    """The modules a ``-X importtime`` run imported."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def heavy(found: set[str]) -> list[str]:
    return sorted(m for m in found if any(m == h or m.startswith(h + ".") for h in HEAVY))


def in_pty(env: dict[str, str], *args: str, timeout: float = 300) -> tuple[int, str]:
    """Run `farm ARGS` with stdin, stdout and stderr on a pseudo-terminal, as a person at a
    terminal does; (exit status, everything it wrote, escape sequences included)."""
    import os
    import pty
    import select
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", *args], stdin=slave, stdout=slave, stderr=slave,
                            env={**env, "TERM": "xterm-256color", "COLUMNS": "120"}, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        os.close(master)
    return rc, out.decode("utf-8", "replace")
