"""Device lab evidence where people look, against a live `farm serve` on SQLite and PostgreSQL:
one small model really built for SM8650 with two QNN SDKs (2.51.0 here, 2.49.40 in its worker
venv), enrolled phones leasing jobs and posting reports signed with their Ed25519 keys. Enrolled
devices measure the 2.49.40 artifact at 30 ms and the 2.51.0 one at 48 ms: coverage, `farm show`
and resolve's answer say so, and flag the slower SDK (1.6x); a simulator's faster report changes
nothing; a revoked phone's report is struck; FARM_RESOLVE_PREFER_FASTEST off leaves resolve's pick
(and its answer, but for the lab's figures) as it was, on picks the faster artifact and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.core.settings import Settings
from farm.pipeline.plan import build
from tests.common.accuracy_models import matmul_model
from tests.common.schemas import valid
from tests.common.service import serve, token
from tests.integration.test_device_lab import _key, _port, _report, call, farm

VENVS = Path(__file__).resolve().parents[2] / ".venvs"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def two_sdks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'index.db'}"
    env_vars = {"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": url,
                "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}"}
    settings = Settings.from_env(env_vars)
    model = matmul_model(tmp_path / "mm.onnx")
    report = build(settings, model, ["qnn:SM8650"], name="mm", tag="cand")
    (o,) = report.outcomes
    assert o.artifact and o.toolchain == "2.51.0", o
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | env_vars
    # The same model built by QNN 2.49.40 (its worker venv, this checkout's code).
    older = subprocess.run([str(VENVS / "qnn-2.49.40" / "bin" / "farm"), "build", str(model), "-t", "qnn:SM8650",
                            "--name", "mm", "--tag", "cand"], env={**env, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=300)
    assert older.returncode == 0 and "2.49.40" in older.stdout, older.stdout + older.stderr
    from registry.index import Registry
    from registry.models import Artifact

    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            arts = {a.toolchain: a.digest for a in s.query(Artifact).filter_by(model_digest=report.model_digest)}
    finally:
        reg.close()
    assert sorted(arts) == ["2.49.40", "2.51.0"] and arts["2.51.0"] == o.artifact
    old = arts["2.49.40"]
    # Jobs on each SDK's artifact (`farm promote` makes them only on the newest SDK's).
    made = subprocess.run([sys.executable, "-m", "farm.cli", "device", "verify", "mm:cand", "--devices", "4", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert [(j["toolchain"], j["artifact"], j["jobs_made"]) for j in valid("device-verify", made.stdout)["jobs"]] == [
        ("2.49.40", old, 4), ("2.51.0", o.artifact, 4)]
    port = _port()
    proc = serve(env, port, tmp_path / "serve.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "admin": token(settings, "ops", "admin"), "settings": settings,
               "env": env, "tmp": tmp_path, "new": o.artifact, "old": old, "port": port}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


RESOLVE = "/v1/resolve?model=mm:cand&soc=SM8650&qnn=2.51.0&manifest=false"


def _raw(lab: dict[str, Any], path: str, tok: str) -> bytes:
    import urllib.request

    req = urllib.request.Request(lab["url"] + path, headers={"Authorization": f"Bearer {tok}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return bytes(r.read())


def _lease_and_report(lab: dict[str, Any], dev: dict[str, Any], p50: dict[str, float], **body: Any) -> str:
    """``dev`` leases its next job and reports what it measured on that job's artifact."""
    status, job = call(lab, "POST", "/v1/device-jobs/lease", dev["token"], body)
    assert status == 200, job
    status, got = _report(lab, dev, job, p50_ms=p50[job["artifact"]], psnr_db=60.0, load_ms=100.0)
    assert status == 201, got
    return str(job["artifact"])


def _cells(lab: dict[str, Any]) -> dict[str, Any]:
    """GET /v1/coverage (`farm coverage --json`'s document): the SM8650 cells' device lab figures by SDK."""
    status, cov = call(lab, "GET", "/v1/coverage", lab["admin"])
    assert status == 200, cov
    valid("coverage", json.dumps(cov))
    return {c["toolchain"]: c["device_lab"] for c in cov["cells"] if c["target"] == "qnn:SM8650"}


def _enroll(lab: dict[str, Any], name: str, soc: str = "simulator", arch: str = "x86_64") -> dict[str, Any]:
    """An agent enrolled over HTTP with a fresh Ed25519 key (the admin's enrollment token)."""
    status, made = call(lab, "POST", "/v1/devices", lab["admin"], {"name": name, "expires": "10m"})
    assert status == 201, made
    key, pub = _key()
    status, body = call(lab, "POST", "/v1/devices/enroll", made["token"],
                        {"public_key": pub, "soc": soc, "facts": {"arch": arch}})
    assert status == 201, body
    return {**body, "key": key}


def test_speed_per_sdk_where_people_look(two_sdks: dict[str, Any]) -> None:
    lab = two_sdks
    reader = token(lab["settings"], "phone-reader", "read")
    before = _raw(lab, RESOLVE, reader)
    assert json.loads(before)["artifact"] == lab["new"]  # the rule: the newest SDK the runtime loads
    # The same over HTTP (admin only): the jobs are there already.
    assert call(lab, "POST", "/v1/device-jobs", reader, {"model": "mm:cand"})[0] == 403
    status, made = call(lab, "POST", "/v1/device-jobs", lab["admin"], {"model": "mm:cand", "devices": 4})
    assert status == 201 and [j["jobs_made"] for j in valid("device-verify", made)["jobs"]] == [0, 0], made
    phones = [_enroll(lab, f"phone-{c}", soc="SM8650", arch="arm64-v8a") for c in "abc"]
    sim = _enroll(lab, "sim")
    measured = {0: {lab["old"]: 29.0, lab["new"]: 47.0}, 1: {lab["old"]: 31.0, lab["new"]: 49.0}}
    for i in (0, 1):
        assert {_lease_and_report(lab, phones[i], measured[i]) for _ in range(2)} == {lab["old"], lab["new"]}

    # Coverage: per SDK the median of enrolled devices, the slower SDK flagged.
    cells = _cells(lab)
    assert cells["2.49.40"] == {"soc": "SM8650", "devices": 2, "failed": 0, "p50_ms": 30.0, "psnr_db": 60.0,
                                "load_ms": 100.0, "simulator_reports": 0}
    assert cells["2.51.0"]["p50_ms"] == 48.0 and cells["2.51.0"]["devices"] == 2
    assert cells["2.51.0"]["slower"] == {"ratio": 1.6, "vs": "2.49.40", "vs_p50_ms": 30.0}
    table = farm(lab, "coverage")
    assert "lab\u00d72 p50 48 ms slower: 1.6x vs QNN 2.49.40" in table.stdout, table.stdout
    page = _raw(lab, "/coverage", lab["admin"]).decode()
    assert "slower: 1.6x vs QNN 2.49.40" in page and "lab\u00d72 p50 30 ms" in page

    # Resolve, preference off: the same pick, the answer as before plus what the lab confirmed.
    after = json.loads(_raw(lab, RESOLVE, reader))
    assert after.pop("device_lab") == [{"soc": "SM8650", "devices": 2, "failed": 0, "p50_ms": 48.0, "psnr_db": 60.0,
                                        "load_ms": 100.0, "simulator_reports": 0}]
    assert after == json.loads(before) and "preferred" not in after

    # farm show: the artifact's lab figures, its flag, every SDK's speed on the SoC.
    shown = valid("show", farm(lab, "show", lab["new"], "--json").stdout)
    (entry,) = shown["device_lab"]
    assert entry["devices"] == 2 and entry["slower"]["ratio"] == 1.6
    assert [(x["toolchain"], x["p50_ms"]) for x in entry["sdks"]] == [("2.49.40", 30.0), ("2.51.0", 48.0)]
    text = farm(lab, "show", lab["new"]).stdout
    assert "lab       SM8650: confirmed by 2 enrolled device(s), p50 48 ms" in text
    assert "slower: 1.6x vs QNN 2.49.40" in text, text
    assert json.loads(farm(lab, "show", lab["old"], "--json").stdout)["device_lab"][0]["slower"] is None

    # A simulator's report, however fast, is no device evidence.
    on = _lease_and_report(lab, sim, {lab["old"]: 0.1, lab["new"]: 0.1}, socs=["SM8650"])
    cells = _cells(lab)
    assert cells["2.51.0" if on == lab["new"] else "2.49.40"]["simulator_reports"] == 1
    assert (cells["2.49.40"]["p50_ms"], cells["2.51.0"]["p50_ms"]) == (30.0, 48.0)
    assert cells["2.51.0"]["slower"]["ratio"] == 1.6 and cells["2.49.40"].get("slower") is None

    # A third phone says the newer SDK is fast; revoked, what it said is struck.
    for _ in range(2):
        _lease_and_report(lab, phones[2], {lab["old"]: 30.0, lab["new"]: 1.0})
    assert _cells(lab)["2.51.0"]["devices"] == 3
    status, revoked = call(lab, "DELETE", "/v1/devices/phone-c", lab["admin"])  # `farm device revoke phone-c`
    assert status == 200 and revoked == {"revoked": "phone-c", "struck": 2}, revoked
    cells = _cells(lab)
    assert (cells["2.51.0"]["devices"], cells["2.51.0"]["p50_ms"], cells["2.51.0"]["slower"]["ratio"]) == (2, 48.0, 1.6)
    again = json.loads(_raw(lab, RESOLVE, reader))
    assert again["artifact"] == lab["new"] and again["device_lab"][0]["devices"] == 2  # the cached answer moved on

    # Preference on (a service setting): the faster artifact the rule serves, and the answer says so.
    port = _port()
    fast = serve({**lab["env"], "FARM_RESOLVE_PREFER_FASTEST": "1"}, port, lab["tmp"] / "serve-fast.log")
    try:
        picked = json.loads(_raw({**lab, "url": f"http://127.0.0.1:{port}"}, RESOLVE, reader))
        # A runtime older than the faster artifact's SDK: the rule does not serve it, speed can't either.
        old_runtime = json.loads(_raw({**lab, "url": f"http://127.0.0.1:{port}"},
                                      RESOLVE.replace("qnn=2.51.0", "qnn=2.49.40"), reader))
    finally:
        fast.terminate()
        fast.wait(timeout=30)
    assert picked["artifact"] == lab["old"] and picked["toolchain"] == "2.49.40"
    assert picked["preferred"] == {"by": "device-latency", "p50_ms": 30.0, "devices": 2, "over": lab["new"],
                                   "over_toolchain": "2.51.0", "over_p50_ms": 48.0}
    assert old_runtime["artifact"] == lab["old"] and "preferred" not in old_runtime
    local = subprocess.run([sys.executable, "-m", "farm.cli", "resolve", "--model", "mm:cand", "--soc", "SM8650",
                            "--qnn", "2.51.0", "--json"], env={**lab["env"], "FARM_RESOLVE_PREFER_FASTEST": "1"},
                           capture_output=True, text=True, timeout=120)
    assert valid("resolve", local.stdout)["preferred"]["over"] == lab["new"], local.stderr
    valid("resolve", json.dumps(picked))
    text = subprocess.run([sys.executable, "-m", "farm.cli", "resolve", "--model", "mm:cand", "--soc", "SM8650",
                           "--qnn", "2.51.0"], env={**lab["env"], "FARM_RESOLVE_PREFER_FASTEST": "1"},
                          capture_output=True, text=True, timeout=120).stdout
    assert f"preferred by device latency: p50 30 ms over {lab['new'][7:19]} (QNN 2.51.0, p50 48 ms)" in text, text
    assert "device lab SM8650: lab\u00d72 p50 30 ms" in text, text

    # Absurd figures, signed by an enrolled phone's own key, are refused (usage) and record nothing:
    # its job stays leased to it, and its good report is the first one.
    import base64

    from farm.core.signed_reports import message
    from tests.common.hostile_lab_reports import CASES, body_text

    phone = _enroll(lab, "phone-d", soc="SM8650", arch="arm64-v8a")
    status, job = call(lab, "POST", "/v1/device-jobs/lease", phone["token"], {})
    assert status == 200, job
    good = {"job": job["job"], "nonce": job["nonce"], "device": "phone-d", "artifact": job["artifact"],
            "soc": "SM8650", "outcome": "ok", "runs": 5, "p50_ms": 30.0}
    for case, field, raw in CASES:
        text = body_text(good, field, raw)
        sig = base64.b64encode(phone["key"].sign(message(text))).decode()
        status, body = call(lab, "POST", f"/v1/device-jobs/{job['job']}/report", phone["token"],
                            {"body": text, "signature": sig})
        assert status == 400 and body["error"]["code"] == "usage" and field in body["error"]["message"], (case, body)
    status, body = _report(lab, phone, job, p50_ms=30.0)
    assert status == 201 and body["created"] is True, body
