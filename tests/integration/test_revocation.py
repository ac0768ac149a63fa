"""Hostile cases: a token revoked with `farm token revoke` is refused at once by every process of
a real `farm serve`, on every route kind (resolve's fast route, a FastAPI route, the coverage page,
device reports' own route), however warm each process's token cache was. On SQLite (one process,
the CLI revokes from another) and PostgreSQL (two processes sharing the port)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from infra.devfarm.services import free_port
from tests.common.service import serve, token

NOTHING = "sha256:" + "0" * 64
READS = [("GET", "/v1/resolve?model=nothing:stable&soc=SM8650&qnn=2.51.0", None),  # resolve's fast route
         ("GET", f"/v1/blobs/{NOTHING}", None),  # a FastAPI route (its sync dependency checks too)
         ("GET", "/coverage", None)]  # the page (its own reader)
REPORT = ("POST", "/v1/reports", b"{}")  # the reports' own route: refused as a body after the token


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(tmp_path / "home")
    workers = 1
    if request.param == "postgres":
        env["FARM_DATABASE_URL"] = request.getfixturevalue("pg_url")
        workers = 2
    settings = Settings.from_env(env)
    tokens = {"dev": token(settings, "dev", "read"), "fleet": token(settings, "fleet", "report"),
              "other": token(settings, "other", "read")}
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log", workers=workers)
    try:
        yield {"env": env, "port": port, "pid": proc.pid, "workers": workers, "tokens": tokens}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _processes(pid: int) -> list[int]:
    """The service's processes: ``pid`` and its children (`farm serve --workers N`)."""
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _answering(pids: list[int], port: int, conn: http.client.HTTPConnection) -> int | None:
    """Which of ``pids`` holds the server side of ``conn`` (an answered keep-alive connection)."""
    client_port = conn.sock.getsockname()[1]
    local, remote = f"0100007F:{port:04X}", f"0100007F:{client_port:04X}"
    inode = next((f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
                  if f[1] == local and f[2] == remote), None)
    if inode is None:
        return None
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def _call(conn: http.client.HTTPConnection, tok: str, method: str, path: str, body: bytes | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {tok}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    data = r.read()
    code = json.loads(data)["error"]["code"] if data.startswith(b'{"error"') else ""
    return r.status, code


def revoke(env: dict[str, str], name: str, kept: list[http.client.HTTPConnection], other: str) -> None:
    """`farm token revoke NAME`, returning when it does; meanwhile the kept connections stay open
    (the service closes one idle for 5 s) with requests of another token."""
    proc = subprocess.Popen([sys.executable, "-m", "farm.cli", "token", "revoke", name], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while True:
            for conn in kept:
                assert _call(conn, other, *READS[0])[0] != 401
            try:
                out, _ = proc.communicate(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out


def test_a_revoked_token_is_refused_at_once_by_every_process(served: dict[str, Any]) -> None:
    """Each process served both tokens many times (its cache holds them) on connections kept
    open; right after `farm token revoke` returns, every request with the token, on those
    connections and on new ones, is 401 ``unauthorized``."""
    port, tokens = served["port"], served["tokens"]
    pids = _processes(served["pid"])
    conns: dict[int, list[http.client.HTTPConnection]] = {}
    for _ in range(200):  # bounded: connections until each process holds two
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        status, _code = _call(conn, tokens["dev"], *READS[0])
        assert status != 401, status
        owner = _answering(pids, port, conn)
        assert owner is not None
        conns.setdefault(owner, []).append(conn)
        if len(conns) == served["workers"] and all(len(c) >= 2 for c in conns.values()):
            break
    assert len(conns) == served["workers"], f"connections reached {len(conns)} of {served['workers']} processes"
    kept = [c for group in conns.values() for c in group[:2]]
    for conn in kept:  # many requests with each token on each process
        for _ in range(5):
            for call in READS:
                status, code = _call(conn, tokens["dev"], *call)
                assert status not in (401, 403, 500), (call, status, code)
            status, code = _call(conn, tokens["fleet"], *REPORT)
            assert status not in (401, 403, 500) and status >= 400, (status, code)  # the token passed; {} did not

    answers: list[tuple[str, int, str]] = []
    t0 = time.monotonic()
    revoke(served["env"], "dev", kept, tokens["other"])
    for i in range(40):  # at once: on every kept connection (both processes), and on new ones
        conn = kept[i % len(kept)] if i % 4 else http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        call = READS[i % len(READS)]
        answers.append((call[1], *_call(conn, tokens["dev"], *call)))
    revoke(served["env"], "fleet", kept, tokens["other"])
    for i in range(12):
        conn = kept[i % len(kept)] if i % 3 else http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        answers.append((REPORT[1], *_call(conn, tokens["fleet"], *REPORT)))
    took = time.monotonic() - t0
    refused = [a for a in answers if a[1:] == (401, "unauthorized")]
    assert len(refused) == len(answers) == 52, [a for a in answers if a not in refused]
    assert took < 60, took
    for conn in kept:
        conn.close()
