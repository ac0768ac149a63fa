"""Device reports over HTTP against a live `farm serve` on PostgreSQL, with real QNN builds behind
it: scopes, hostile bodies with stable codes, one device counted once, resolve moving
from probe to device evidence and away from an artifact devices report failing, revocation,
the rate limit and the metrics; the registry stays consistent through every refusal."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.accuracy_models import matmul_model
from tests.common.service import serve, token

RATE = 40  # FARM_REPORTS_PER_MINUTE of the service under test


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live(pg_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    yield from _live(pg_url, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def live_any(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'index.db'}"
    yield from _live(url, tmp_path)


@pytest.fixture
def live_shared(pg_url: str, redis_server: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Two service processes with a broker: the report count is the service's, not a process's."""
    yield from _live(pg_url, tmp_path, workers=2, extra={"FARM_BROKER_URL": f"{redis_server}/0"})


def _live(db_url: str, tmp_path: Path, *, workers: int = 1,
          extra: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    import os

    env_vars = {"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": db_url,
                "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}", "FARM_REPORTS_PER_MINUTE": str(RATE),
                **(extra or {})}
    settings = Settings.from_env(env_vars)
    model = matmul_model(tmp_path / "mm.onnx")
    (o,) = build(settings, model, ["qnn:SM8650"], name="mm", tag="stable").outcomes
    tokens = {scope: token(settings, f"t-{scope}", scope) for scope in ("read", "submit", "admin", "report")}
    tokens["report2"] = token(settings, "t-report2", "report")
    tokens["report3"] = token(settings, "t-report3", "report")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | env_vars
    port = _port()
    proc = serve(env, port, tmp_path / "serve.log", workers=workers)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "tokens": tokens, "artifact": o.artifact, "settings": settings,
               "env": env}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def call(svc: dict[str, Any], method: str, path: str, tok: str | None, body: bytes | dict[str, Any] | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(svc["url"] + path, data=data, method=method,
                                 headers={**({"Authorization": f"Bearer {tok}"} if tok else {}),
                                          "Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def report(svc: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"artifact": svc["artifact"], "device_id": "dev-1", "device_model": "Pixel-ish 9", "soc": "SM8650",
            "os": "Android 15", "arch": "aarch64", "runtime_version": "2.51.0", "onnxruntime": "1.31.1",
            "ep_package": "onnxruntime-qnn", "ep_version": "2.7.0", "outcome": "loads", "load_ms": 12.5,
            "first_inference_ms": 3, "peak_memory_mb": 80.0, **over}


def resolve(svc: dict[str, Any], qnn: str = "2.51.0", soc: str = "SM8650") -> tuple[int, Any]:
    return call(svc, "GET", f"/v1/resolve?model=mm:stable&soc={soc}&qnn={qnn}&manifest=false",
                svc["tokens"]["read"])


def rows(svc: dict[str, Any]) -> list[tuple[Any, ...]]:
    from sqlalchemy import text

    from registry.index import Registry

    reg = Registry.open(svc["settings"])
    try:
        with reg.db.session() as s:
            return [tuple(r) for r in s.execute(text(
                "SELECT device_id, outcome, count, revoked_at IS NULL FROM device_reports ORDER BY id"))]
    finally:
        reg.close()


def test_reports_scopes_hostile_bodies_and_resolve(live: dict[str, Any]) -> None:
    svc, t = live, live["tokens"]
    status, before = resolve(svc)
    assert status == 200 and before["source"] == "probe"

    # Scopes: only report (and admin) tokens report; a report token reads and submits nothing.
    assert call(svc, "POST", "/v1/reports", None, report(svc))[0] == 401
    for scope in ("read", "submit"):
        status, body = call(svc, "POST", "/v1/reports", t[scope], report(svc))
        assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = call(svc, "GET", "/v1/resolve?model=mm:stable&soc=SM8650&qnn=2.51.0", t["report"])
    assert (status, body["error"]["code"]) == (403, "forbidden")
    assert call(svc, "POST", "/v1/releases", t["report"], {"model": "mm:stable", "targets": ["qnn:SM8650"]})[0] == 403

    # Hostile bodies: stable codes, nothing written.
    hostile: list[tuple[bytes | dict[str, Any], int, str]] = [
        (b"x" * 20_000, 413, "too-large"),
        (b"", 400, "usage"),
        (b"{not json", 400, "usage"),
        (b"[]", 400, "usage"),
        (report(svc, load_ms="12"), 400, "usage"),
        (report(svc, load_ms=True), 400, "usage"),
        (report(svc, load_ms=-1), 400, "usage"),
        (report(svc, outcome="maybe"), 400, "usage"),
        (report(svc, extra_field=1), 400, "usage"),
        (report(svc, device_id="../../etc"), 400, "usage"),
        (report(svc, error="e" * 5000, outcome="fails"), 400, "usage"),
        (report(svc, reported_at="2999-01-01T00:00:00Z"), 400, "usage"),
        (report(svc, reported_at="2026-11-25T12:00:00"), 400, "usage"),
        (report(svc, runtime_version="latest"), 400, "usage"),
        (report(svc, artifact="sha256:" + "0" * 64), 404, "not-found"),
        (report(svc, artifact="sha256:short"), 400, "usage"),
        (report(svc, soc="SM9999"), 400, "unknown-target"),
    ]
    for body, code, err in hostile:
        status, answer = call(svc, "POST", "/v1/reports", t["report"], body)
        assert (status, answer["error"]["code"]) == (code, err), (body if isinstance(body, dict) else body[:40])
        assert "Traceback" not in json.dumps(answer)
    assert rows(svc) == []

    # One device reports twice: it counts once; one token's word alone changes nothing in resolve.
    for _ in range(2):
        status, got = call(svc, "POST", "/v1/reports", t["report"], report(svc, reported_at="2026-11-25T12:00:00Z"))
        assert status == 201 and got["runtime"] == "qnn:2.51.0" and got["soc"] == "SM8650"
    status, agg = call(svc, "GET", f"/v1/reports?artifact={svc['artifact']}", t["read"])
    assert status == 200
    (entry,) = agg["devices"]
    assert (entry["devices"], entry["tokens"], entry["loads"], entry["reports"], entry["load_ms_p50"]) == \
        (1, 1, 1, 2, 12.5)
    assert resolve(svc)[1]["source"] == "probe"
    # A second, independent token: now devices verified it.
    assert call(svc, "POST", "/v1/reports", t["report3"], report(svc, device_id="dev-2"))[0] == 201
    status, after = resolve(svc)
    assert after["source"] == "device" and "loaded on 2 device(s) (2 report tokens)" in after["reason"]
    # Another runtime's resolve is untouched by 2.51.0's reports.
    status, other = resolve(svc, "2.52.0")
    assert status == 200 and other["source"] == "rule"

    # Revoking the token's reports takes the evidence back.
    status, body = call(svc, "DELETE", "/v1/reports?token=t-report", t["read"])
    assert status == 403
    status, body = call(svc, "DELETE", "/v1/reports?token=t-report", t["admin"])
    assert status == 200 and body["revoked"] == 1
    assert resolve(svc)[1]["source"] == "probe"
    assert call(svc, "DELETE", "/v1/reports?token=t-report3", t["admin"])[1]["revoked"] == 1

    # Devices that fail: one token alone never withholds it, however many ids; two tokens do.
    for i in range(3):
        status, _ = call(svc, "POST", "/v1/reports", t["report2"],
                         report(svc, device_id=f"bad-{i}", outcome="fails", error="QNN_CONTEXT_ERROR_INVALID_ARGUMENT"))
        assert status == 201
        assert resolve(svc)[0] == 200
    assert call(svc, "POST", "/v1/reports", t["report"],
                report(svc, device_id="bad-x", outcome="fails", error="QNN_CONTEXT_ERROR_INVALID_ARGUMENT"))[0] == 201
    status, answer = resolve(svc)
    assert status == 404 and answer["error"]["code"] == "no-match"
    assert "failed on 4 device(s) (2 report tokens)" in answer["error"]["hint"]
    assert "runtime >=" not in answer["error"]["hint"] and "quarantined reports" in answer["error"]["hint"]
    assert resolve(svc, "2.52.0")[0] == 200
    # Ops see why, and lift it.
    assert call(svc, "GET", "/v1/reports/quarantined", t["read"])[0] == 403
    status, q = call(svc, "GET", "/v1/reports/quarantined", t["admin"])
    (cell,) = q["quarantined"]
    assert (cell["artifact"], cell["soc"], cell["runtime"], cell["failed_devices"], cell["failed_tokens"]) == \
        (svc["artifact"], "SM8650", "qnn:2.51.0", 4, 2)
    status, lifted = call(svc, "POST", "/v1/reports/lift", t["admin"],
                          {"artifact": svc["artifact"], "soc": "snapdragon-8-gen-3", "runtime": "2.51.0"})
    assert (status, lifted["lifted"]) == (200, 4)
    assert resolve(svc)[0] == 200 and call(svc, "GET", "/v1/reports/quarantined", t["admin"])[1]["quarantined"] == []
    for i in range(3):
        call(svc, "POST", "/v1/reports", t["report2"], report(svc, device_id=f"bad-{i}", outcome="crashed"))
    call(svc, "POST", "/v1/reports", t["report"], report(svc, device_id="bad-x", outcome="crashed"))
    assert resolve(svc)[0] == 404, "new independent failures quarantine it again"

    # Metrics count what was received and refused.
    with urllib.request.urlopen(svc["url"] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'ctxfarm_reports_total{outcome="fails",runtime="qnn:2.51.0"} 4.0' in text
    assert 'ctxfarm_reports_refused_total{code="usage"}' in text


def _fresh_minute() -> None:
    """Counts are per wall-clock minute: a burst that straddles one would be counted twice."""
    import time

    if time.time() % 60 > 50:
        time.sleep(61 - time.time() % 60)


@pytest.mark.parametrize("processes", ["one", "two, one count in Redis"])
def test_rate_limit_per_token(processes: str, request: pytest.FixtureRequest) -> None:
    svc = request.getfixturevalue("live" if processes == "one" else "live_shared")
    t = svc["tokens"]
    _fresh_minute()
    codes = [call(svc, "POST", "/v1/reports", t["report"], report(svc, device_id=f"d{i}"))[0]
             for i in range(RATE + 3)]
    assert codes[:RATE] == [201] * RATE and codes[RATE:] == [429] * 3
    # Another token is not held back by this one.
    assert call(svc, "POST", "/v1/reports", t["report2"], report(svc))[0] == 201
    assert len(rows(svc)) == RATE + 1


def test_install_report_on_the_simulator_host_does_not_report(live: dict[str, Any], tmp_path: Path) -> None:
    """`farm install --report` on this x86_64 host: the install as without --report (exit 0, the
    path on stdout), a warning that it won't report, nothing recorded; `farm report` from here is
    refused by the service (not-device-evidence) with its code, no traceback."""
    import os
    import subprocess
    import sys

    svc, t = live, live["tokens"]
    root = Path(__file__).resolve().parents[2]
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    base["PYTHONPATH"] = str(root)
    env = {**base, "FARM_SERVER": svc["url"], "FARM_TOKEN": t["read"], "FARM_REPORT_TOKEN": t["report"],
           "FARM_DEVICE_ID": "sim-0", "FARM_HOME": str(tmp_path / "dev0")}
    args = ["install", "--model", "mm:stable", "--soc", "SM8650", "--qnn", "2.51.0"]
    plain = subprocess.run([sys.executable, "-m", "farm.cli", *args, "--dest", str(tmp_path / "a")],
                           env=env, capture_output=True, text=True, timeout=300)
    with_report = subprocess.run([sys.executable, "-m", "farm.cli", *args, "--dest", str(tmp_path / "b"), "--report"],
                                 env=env, capture_output=True, text=True, timeout=300)
    assert plain.returncode == with_report.returncode == 0, with_report.stderr
    assert with_report.stdout.replace(str(tmp_path / "b"), "D") == plain.stdout.replace(str(tmp_path / "a"), "D")
    assert "not reporting" in with_report.stderr and "simulator" in with_report.stderr
    assert rows(svc) == []
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "report", "--artifact", svc["artifact"], "--soc",
                           "SM8650", "--qnn", "2.51.0", "--outcome", "crashed", "--error", "SIGSEGV",
                           "--onnxruntime", "1.31.1"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "error[not-device-evidence]" in proc.stderr and "Traceback" not in proc.stderr
    # From a host driving a phone (adb): its arch is the phone's.
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "report", "--artifact", svc["artifact"], "--soc",
                           "snapdragon-8-gen-3", "--qnn", "2.51.0", "--outcome", "loads", "--arch", "arm64-v8a",
                           "--device-model", "Phone\x1b[31m \u202eX", "--onnxruntime", "1.31.1", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["soc"] == "SM8650"


def test_hostile_corpus_leaves_resolve_for_real_devices_unchanged(live_any: dict[str, Any]) -> None:
    """tests/common/hostile_reports.py posted to the real service (SQLite and PostgreSQL): each
    case refused with its code and nothing written; then the behaviours no body check catches (a
    one-token sybil, the simulator, an older-runtime `loads`, a wrong SoC) leave resolve's answer
    for real devices as it was. Stored text with escapes prints escaped."""
    import os
    import subprocess
    import sys

    from tests.common.hostile_reports import CASES, good_report

    svc, t = live_any, live_any["tokens"]
    before = {(soc, qnn): resolve(svc, qnn, soc) for soc in ("SM8650", "SM8750") for qnn in ("2.47.0", "2.51.0")}
    assert before[("SM8650", "2.51.0")][0] == 200 and before[("SM8650", "2.47.0")][0] == 404

    for name, over, status_want, code in CASES:
        status, answer = call(svc, "POST", "/v1/reports", t["report"], good_report(svc["artifact"], **over))
        assert (status, answer["error"]["code"]) == (status_want, code), name
        assert "Traceback" not in json.dumps(answer)
    assert rows(svc) == []

    # One token, many invented ids: failures and loads alike change nothing.
    for i in range(6):
        assert call(svc, "POST", "/v1/reports", t["report2"],
                    good_report(svc["artifact"], device_id=f"sybil-{i}", outcome="crashed", error="SIGSEGV"))[0] == 201
    after = {k: resolve(svc, k[1], k[0]) for k in before}
    assert after == before
    for i in range(6):
        call(svc, "POST", "/v1/reports", t["report3"], good_report(svc["artifact"], device_id=f"s-{i}"))
    after = {k: resolve(svc, k[1], k[0]) for k in before}
    assert after == before, "one token's loads don't make resolve prefer it either"

    # Stored text printed by `farm reports show` is escaped (a row written past the service's checks).
    from sqlalchemy import text

    from registry.index import Registry

    reg = Registry.open(svc["settings"])
    try:
        with reg.db.session() as s:
            s.execute(text("UPDATE device_reports SET error = :e WHERE outcome = 'crashed'"),
                      {"e": "\x1b[2J\x9b31mEVIL\u202eLIVE\r\nforged line"})
    finally:
        reg.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | {
        k: v for k, v in svc["env"].items() if k.startswith("FARM_")} | {
        "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    shown = subprocess.run([sys.executable, "-m", "farm.cli", "reports", "show", svc["artifact"]], env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert not any(ch in shown.stdout for ch in "\x1b\x9b\u202e\r") and "\\u202e" in shown.stdout
