"""Run the real `farm` CLI in a subprocess, as users and pipelines do."""

from __future__ import annotations

import subprocess
import sys


def farm(env: dict[str, str], *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "farm.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"farm {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


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
