"""Processes a test started, and their descendants, found by PID through /proc (never by name
across the host: a test must not touch processes it did not start)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(root: int) -> list[int]:
    """Every live process whose ancestry reaches ``root`` (a process this test started)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pp = _ppid(int(entry))
            if pp is not None:
                parents[int(entry)] = pp
    out = []
    for pid in parents:
        p = pid
        while p in parents and p not in (0, 1):
            p = parents[p]
            if p == root:
                out.append(pid)
                break
    return sorted(out)


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def compile_children(root: int) -> list[int]:
    """Compile processes under ``root``: a job forked by a warm compile host (named
    ``ctxfarm-compile``; it keeps its host's command line) or a fresh compile child."""
    return [p for p in descendants(root)
            if (comm(p) == "ctxfarm-compile" or "workers.qnn.child compile" in cmdline(p)) and alive(p)]


def compile_hosts(root: int) -> list[int]:
    """Warm compile hosts under ``root``, not their jobs or standbys: forks that keep the host's
    command line (and, for a moment after the fork, its name), so told apart by their parent."""
    def host(p: int) -> bool:
        return "workers.qnn.child host" in cmdline(p)

    return [p for p in descendants(root) if host(p) and not host(_ppid(p) or 0) and alive(p)]


def standbys(root: int) -> list[int]:
    """The job processes the hosts under ``root`` forked ahead (workers.childproc: the standby)."""
    return [p for p in descendants(root) if comm(p) == "ctxfarm-standby" and alive(p)]


def wait_for(pred, timeout: float, poll: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    return pred()


def recorded_states(home: Path) -> list[str]:
    """The build states of the embedded index under ``home``, by id, read with sqlite3 (the index
    may not exist yet: `farm build` starts its compiles before it records the builds,
    farm.pipeline.early)."""
    import sqlite3

    db = Path(home) / "index.db"
    if not db.exists():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as c:
            return [r[0] for r in c.execute("SELECT state FROM builds ORDER BY id")]
    except sqlite3.Error:
        return []


def at_once(n: int, call: Any) -> list[Any]:
    """``call(i)`` from ``n`` threads released together (a barrier), their answers in order."""
    import threading

    gate = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        gate.wait()
        out[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    return out
