"""Device reports over HTTP against a live `farm serve` on PostgreSQL, with real QNN builds behind
it (issue 23): scopes, hostile bodies with stable codes, one device counted once, resolve moving
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
    import os

    env_vars = {"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": pg_url,
                "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}", "FARM_REPORTS_PER_MINUTE": str(RATE)}
    settings = Settings.from_env(env_vars)
    model = matmul_model(tmp_path / "mm.onnx")
    (o,) = build(settings, model, ["qnn:SM8650"], name="mm", tag="stable").outcomes
    tokens = {scope: token(settings, f"t-{scope}", scope) for scope in ("read", "submit", "admin", "report")}
    tokens["report2"] = token(settings, "t-report2", "report")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | env_vars
    port = _port()
    proc = serve(env, port, tmp_path / "serve.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "tokens": tokens, "artifact": o.artifact, "settings": settings}
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
            "os": "Android 15", "runtime_version": "2.51.0", "onnxruntime": "1.31.1",
            "ep_package": "onnxruntime-qnn", "ep_version": "2.7.0", "outcome": "loads", "load_ms": 12.5,
            "first_inference_ms": 3, "peak_memory_mb": 80.0, **over}


def resolve(svc: dict[str, Any], qnn: str = "2.51.0") -> tuple[int, Any]:
    return call(svc, "GET", f"/v1/resolve?model=mm:stable&soc=SM8650&qnn={qnn}&manifest=false",
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

    # One device reports twice: it counts once; resolve now says devices verified it.
    for _ in range(2):
        status, got = call(svc, "POST", "/v1/reports", t["report"], report(svc, reported_at="2026-11-25T12:00:00Z"))
        assert status == 201 and got["runtime"] == "qnn:2.51.0" and got["soc"] == "SM8650"
    status, agg = call(svc, "GET", f"/v1/reports?artifact={svc['artifact']}", t["read"])
    assert status == 200
    (entry,) = agg["devices"]
    assert (entry["devices"], entry["loads"], entry["reports"], entry["load_ms_p50"]) == (1, 1, 2, 12.5)
    status, after = resolve(svc)
    assert after["source"] == "device" and "loaded on 1 device(s)" in after["reason"]
    # Another runtime's resolve is untouched by 2.51.0's reports.
    status, other = resolve(svc, "2.52.0")
    assert status == 200 and other["source"] == "rule"

    # Revoking the token's reports takes the evidence back.
    status, body = call(svc, "DELETE", "/v1/reports?token=t-report", t["read"])
    assert status == 403
    status, body = call(svc, "DELETE", "/v1/reports?token=t-report", t["admin"])
    assert status == 200 and body["revoked"] == 1
    assert resolve(svc)[1]["source"] == "probe"

    # Devices that fail: under the threshold still served; at it, not served to that runtime.
    for i in range(3):
        status, _ = call(svc, "POST", "/v1/reports", t["report2"],
                         report(svc, device_id=f"bad-{i}", outcome="fails", error="QNN_CONTEXT_ERROR_INVALID_ARGUMENT"))
        assert status == 201
        status, answer = resolve(svc)
        if i < 2:
            assert status == 200
    assert status == 404 and answer["error"]["code"] == "no-match"
    assert "failed on 3 device(s)" in answer["error"]["hint"]
    assert resolve(svc, "2.52.0")[0] == 200

    # Metrics count what was received and refused.
    with urllib.request.urlopen(svc["url"] + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'ctxfarm_reports_total{outcome="fails",runtime="qnn:2.51.0"} 3.0' in text
    assert 'ctxfarm_reports_refused_total{code="usage"}' in text


def test_rate_limit_per_token(live: dict[str, Any]) -> None:
    svc, t = live, live["tokens"]
    codes = [call(svc, "POST", "/v1/reports", t["report"], report(svc, device_id=f"d{i}"))[0]
             for i in range(RATE + 3)]
    assert codes[:RATE] == [201] * RATE and codes[RATE:] == [429] * 3
    # Another token is not held back by this one.
    assert call(svc, "POST", "/v1/reports", t["report2"], report(svc))[0] == 201
    assert len(rows(svc)) == RATE + 1


def test_devices_install_load_report_and_change_resolve(live: dict[str, Any], tmp_path: Path) -> None:
    """Simulated devices are processes: two install through the service with the stdlib client,
    load on the simulator and report (resolve turns to device evidence); one loads with an older
    runtime venv (QNN 2.47.0) and reports its failure under that runtime."""
    import os
    import subprocess
    import sys

    svc, t = live, live["tokens"]
    root = Path(__file__).resolve().parents[2]
    base = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    base["PYTHONPATH"] = str(root)
    outs = []
    for i in range(2):
        env = {**base, "FARM_SERVER": svc["url"], "FARM_TOKEN": t["read"], "FARM_REPORT_TOKEN": t["report"],
               "FARM_DEVICE_ID": f"sim-{i}", "FARM_HOME": str(tmp_path / f"dev{i}")}
        proc = subprocess.run([sys.executable, "-m", "farm.cli", "install", "--model", "mm:stable", "--soc", "SM8650",
                               "--qnn", "2.51.0", "--dest", str(tmp_path / f"dev{i}" / "mm"), "--report", "--json"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout))
    assert {o["report"]["outcome"] for o in outs} == {"loads"}
    status, answer = resolve(svc)
    assert status == 200 and answer["source"] == "device" and "loaded on 2 device(s)" in answer["reason"]
    status, page = call(svc, "GET", "/v1/coverage/models?model=mm:stable", t["read"])
    (cell,) = [c for m in page["models"] for c in m["cells"]]
    assert status == 200 and cell["devices"] == 2 and cell["device_verified"]
    # The coverage page's cell says how many devices confirmed it.
    page_req = urllib.request.Request(svc["url"] + "/coverage", headers={"Authorization": f"Bearer {t['read']}"})
    with urllib.request.urlopen(page_req, timeout=30) as r:
        assert "\u2713device \u00d72" in r.read().decode()

    old = root / ".venvs" / "qnn-2.47.0" / "bin" / "python"
    if not old.exists():
        pytest.fail(f"{old} missing: run infra/workers/create-venvs.sh (infra/test.sh does)")
    env = {**base, "FARM_REPORT_TOKEN": t["report"], "FARM_DEVICE_ID": "old-runtime", "FARM_SERVER": svc["url"]}
    script = ("import sys, json; from pathlib import Path; from types import SimpleNamespace as N;"
              "from farm.cli.report_cmd import install_report;"
              f"r = install_report(N(soc='SM8650', report_token=None, server={svc['url']!r}),"
              f" N(artifact={svc['artifact']!r}, ctx_model=Path({str(outs[0]['ctx_model'])!r})), '2.47.0');"
              "print(json.dumps(r))")
    proc = subprocess.run([str(old), "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["outcome"] == "fails" and got["runtime"] == "qnn:2.47.0"
    # From a shell: farm report (a crash seen on a third device of 2.51.0).
    env = {**base, "FARM_SERVER": svc["url"], "FARM_REPORT_TOKEN": t["report"], "FARM_HOME": str(tmp_path / "sh")}
    proc = subprocess.run([sys.executable, "-m", "farm.cli", "report", "--artifact", svc["artifact"], "--soc",
                           "snapdragon-8-gen-3", "--qnn", "2.51.0", "--outcome", "crashed", "--error", "SIGSEGV in HTP",
                           "--device-id", "shell-1", "--onnxruntime", "1.31.1", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["soc"] == "SM8650"
    bad = subprocess.run([sys.executable, "-m", "farm.cli", "report", "--artifact", "sha256:" + "0" * 64, "--soc",
                          "SM8650", "--qnn", "2.51.0", "--outcome", "loads"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "error[not-found]" in bad.stderr and "Traceback" not in bad.stderr
    status, agg = call(svc, "GET", f"/v1/reports?artifact={svc['artifact']}", t["read"])
    by_runtime = {e["runtime"]: e for e in agg["devices"]}
    assert by_runtime["qnn:2.51.0"]["loads"] == 2 and by_runtime["qnn:2.47.0"]["fails"] == 1
    assert by_runtime["qnn:2.51.0"]["crashed"] == 1
    assert "QNN" in (by_runtime["qnn:2.47.0"]["last_error"] or "")
