"""`farm serve --workers N` on PostgreSQL: several processes, each with its own pool
and answer cache, answer as one service. A tag moved through one process is seen by the next
request to any other; a published artifact (a generation bump) is never answered stale by a
process that cached the older answer; /metrics adds up every process's requests."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from infra.devfarm.services import free_port
from registry.index import Registry, set_tag
from tests.common.cli import farm
from tests.common.index_rows import add_artifact, add_model
from tests.common.service import serve, token

Q = "/v1/resolve?model=m:stable&soc=SM8650&qnn=2.51.0&manifest=false"
WORKERS = 2


def _get(port: int, path: str, tok: str, method: str = "GET", body: dict[str, Any] | None = None
         ) -> tuple[int, dict[str, Any]]:
    # A new connection per request: the kernel hands each accepted connection to any of the
    # processes listening on the port, so requests spread over them.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Authorization": f"Bearer {tok}",
                                                       **({"Content-Type": "application/json"} if data else {})})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw and raw[:1] == b"{" else {"text": raw.decode(errors="replace")})
    finally:
        conn.close()


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = (task / "children").read_text().split()
        out.update(int(k) for k in kids)
    return out


@pytest.fixture
def service(pg_url: str, tmp_path: Path) -> Any:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": pg_url,
           "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    env.pop("FARM_BROKER_URL", None)
    settings = Settings.from_env(env)
    reg = Registry.open(settings)
    with reg.db.session() as s:
        a = add_model(s, "a", name="m").digest
        b = add_model(s, "b", name="m").digest
        set_tag(s, "m", "stable", a)
        art_a = add_artifact(s, a, toolchain="2.50.0").digest
        art_b = add_artifact(s, b, toolchain="2.50.0").digest
    read, admin = token(settings, "device", "read"), token(settings, "ops", "admin")
    reporter = token(settings, "fleet", "report")
    port = free_port()
    proc = serve(env, port, tmp_path / "serve.log", workers=WORKERS)
    try:
        yield {"port": port, "reg": reg, "read": read, "admin": admin, "reporter": reporter, "a": a, "b": b,
               "art_a": art_a,
               "art_b": art_b, "proc": proc, "metrics_dir": metrics_dir}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        reg.close()


def _warm(svc: dict[str, Any], expect: str, n: int = 40) -> None:
    """Ask often enough that every process has answered (and cached) the question."""
    for _ in range(n):
        status, body = _get(svc["port"], Q, svc["read"])
        assert status == 200 and body["artifact"] == expect, body


def test_processes_share_the_port_and_stay_coherent(service: dict[str, Any]) -> None:
    svc, port = service, service["port"]
    assert len(_children(svc["proc"].pid)) >= WORKERS  # the supervisor and its processes

    def answered() -> set[str]:
        # Each process that answered resolve wrote its own measures file (multiprocess metrics).
        return {p.name for p in svc["metrics_dir"].iterdir() if p.name.startswith("histogram_")}

    # Until every process has answered (and cached) the question: /healthz answered as soon as
    # the first one was up.
    deadline = time.monotonic() + 60
    while len(answered()) < WORKERS and time.monotonic() < deadline:
        _warm(svc, svc["art_a"], n=10)
    assert len(answered()) >= WORKERS, answered()
    _warm(svc, svc["art_a"])

    # The tag moves through one process (PUT on one connection) ...
    status, moved = _get(port, "/v1/tags/m/stable", svc["admin"], "PUT", {"digest": svc["b"], "force": True})
    assert status == 200 and moved["moved"], moved
    # ... and every next request, whichever process takes it, answers the new model: no process
    # serves its cached answer for the old digest.
    for _ in range(30):
        status, body = _get(port, Q, svc["read"])
        assert status == 200 and body["model"] == svc["b"] and body["artifact"] == svc["art_b"], body

    # A newer build of the model bumps its generation: every process drops the answer it kept.
    with svc["reg"].db.session() as s:
        newer = add_artifact(s, svc["b"], toolchain="2.51.0").digest
    for _ in range(30):
        status, body = _get(port, Q, svc["read"])
        assert status == 200 and body["artifact"] == newer, body

    # The report route makes its counters on first use, in each process: refused reports count.
    for _ in range(10):
        assert _get(port, "/v1/reports", svc["reporter"], "POST", {})[0] == 400

    # /metrics, from whichever process, counts the requests of all of them.
    total = 0.0
    for _ in range(4):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        total = max(total, next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                                if line.startswith("ctxfarm_resolve_seconds_count")))
        assert "ctxfarm_builds{" in text  # the index's figures are there too
        # Each family once (a scrape with duplicates fails), the routes' own counters included.
        types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
        assert len(types) == len(set(types)), sorted(t for t in types if types.count(t) > 1)
    assert total >= 100, total


def test_sqlite_refuses_more_than_one_process(tmp_path: Path) -> None:
    # The embedded service (a SQLite index: one writer) runs one process; asking for more is a
    # usage error with the way out, before anything listens.
    env = {**os.environ, "FARM_HOME": str(tmp_path / "home")}
    env.pop("FARM_DATABASE_URL", None)
    proc = farm(env, "serve", "--port", str(free_port()), "--workers", "3", check=False, timeout=60)
    assert proc.returncode == 2, proc.stderr  # the usage exit status
    assert "usage" in proc.stderr and "SQLite" in proc.stderr and "PostgreSQL" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
