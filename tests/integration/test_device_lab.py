"""The device lab against a live `farm serve` (SQLite; the lease race on PostgreSQL), with a real QNN
build of a small plain model behind it: two simulator agents enrolled with `ctxfarm-agent enroll`,
`farm promote` making the jobs, each agent running one with `run --once` (install, simulator run,
CPU reference) and posting a signed report; promotion on that evidence only with
--allow-simulator, the gate, rollback; and the attacks on the report path, each refused with its
code and nothing recorded."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import subprocess
import sys
import threading
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


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env_vars(tmp_path: Path, db_url: str) -> dict[str, str]:
    return {"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": db_url,
            "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}"}


def _built(tmp_path: Path, db_url: str) -> str:
    """The lab's model (mm.onnx) really built for SM8650 and tagged mm:cand: its artifact."""
    model = matmul_model(tmp_path / "mm.onnx")
    (o,) = build(Settings.from_env(_env_vars(tmp_path, db_url)), model, ["qnn:SM8650"], name="mm", tag="cand").outcomes
    assert o.artifact, o
    return str(o.artifact)


@pytest.fixture(scope="module")
def built_on_sqlite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The SQLite labs' farm once per module (a folder: the model, its index, blobs and home) and
    its artifact; each test works on a copy of the folder (the same build in ~10 ms, not a compile)."""
    base = tmp_path_factory.mktemp("lab-built")
    return base, _built(base, f"sqlite:///{base / 'index.db'}")


def _sqlite_lab(tmp_path: Path, built: tuple[Path, str]) -> Iterator[dict[str, Any]]:
    import shutil

    shutil.copytree(built[0], tmp_path, dirs_exist_ok=True)
    yield from _lab(tmp_path, f"sqlite:///{tmp_path / 'index.db'}", built[1])


@pytest.fixture
def lab(tmp_path: Path, built_on_sqlite: tuple[Path, str]) -> Iterator[dict[str, Any]]:
    yield from _sqlite_lab(tmp_path, built_on_sqlite)


@pytest.fixture(params=["sqlite", "postgresql"])
def lab_any(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    if request.param == "sqlite":
        yield from _sqlite_lab(tmp_path, request.getfixturevalue("built_on_sqlite"))
        return
    url = request.getfixturevalue("pg_url")
    yield from _lab(tmp_path, url, _built(tmp_path, url))


def _lab(tmp_path: Path, db_url: str, artifact: str) -> Iterator[dict[str, Any]]:
    env_vars = _env_vars(tmp_path, db_url)
    settings = Settings.from_env(env_vars)
    admin = token(settings, "ops", "admin")
    # A bogus FARM_TOKEN in every child's environment: the agent must never read it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")} | env_vars | {"FARM_TOKEN": "cfk_bogus"}
    port = _port()
    proc = serve(env, port, tmp_path / "serve.log")
    try:
        yield {"url": f"http://127.0.0.1:{port}", "admin": admin, "artifact": artifact, "settings": settings,
               "env": env, "tmp": tmp_path}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def call(lab: dict[str, Any], method: str, path: str, tok: str | None, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(lab["url"] + path, data=data, method=method,
                                 headers={**({"Authorization": f"Bearer {tok}"} if tok else {}),
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def farm(lab: dict[str, Any], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm.cli", *argv], env=lab["env"], capture_output=True, text=True,
                          timeout=120)


def agent(lab: dict[str, Any], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workers.agent.main", *argv], env=lab["env"], capture_output=True,
                          text=True, timeout=300)


def enroll_token(lab: dict[str, Any], name: str) -> str:
    got = farm(lab, "device", "enroll", name, "--expires", "10m")
    assert got.returncode == 0, got.stderr
    assert "shown once" in got.stderr
    return got.stdout.strip().splitlines()[-1]


def test_two_simulator_agents_verify_and_promote(lab: dict[str, Any]) -> None:
    homes = {}
    for name in ("sim-a", "sim-b"):
        tok = enroll_token(lab, name)
        home = lab["tmp"] / f"agent-{name}"
        got = agent(lab, "enroll", "--server", lab["url"], "--token", tok, "--home", str(home))
        assert got.returncode == 0, got.stderr
        ident = json.loads(got.stdout)
        assert ident["soc"] == "simulator" and ident["simulator"] is True and ident["facts"]["arch"] == "x86_64"
        for f in ("device-key.pem", "identity.json"):
            assert stat.S_IMODE((home / f).stat().st_mode) == 0o600
        homes[name] = home
        # The enrollment token is single use.
        again = agent(lab, "enroll", "--server", lab["url"], "--token", tok, "--home", str(lab["tmp"] / "again"))
        assert again.returncode != 0 and "error[enrollment-invalid]" in again.stderr, again.stderr
    listed = json.loads(farm(lab, "device", "list", "--json").stdout)
    assert {d["name"]: d["state"] for d in listed} == {"sim-a": "enrolled", "sim-b": "enrolled"}

    ask = {"model": "mm:cand", "to": "stable", "require": "devices>=2 per soc,psnr>=30"}
    status, body = call(lab, "POST", "/v1/promotions", lab["admin"], ask)
    assert status == 409 and body["error"]["code"] == "promotion-unmet", body
    assert body["account"]["socs"]["SM8650"]["missing"] == 2 and body["account"]["socs"]["SM8650"]["jobs_open"] == 2

    # The tag the promotion moves points at another model first (a build of other weights).
    build(lab["settings"], matmul_model(lab["tmp"] / "mm2.onnx", seed=1), ["qnn:SM8650"], name="mm", tag="stable")
    before = json.loads(farm(lab, "tag", "--history", "mm:stable", "--json").stdout)["digest"]
    # Simulator reports are no device evidence without --allow-simulator; with it, a waiting promote
    # moves the tag once the agents' reports are in.
    argv = ["promote", "mm:cand", "--to", "stable", "--require", "devices>=2 per soc,psnr>=30", "--server", lab["url"],
            "--token", lab["admin"]]
    waiting = subprocess.Popen([sys.executable, "-m", "farm.cli", *argv, "--allow-simulator", "--wait", "--timeout",
                                "240", "--json"], env=lab["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        for name, home in homes.items():
            got = agent(lab, "run", "--home", str(home), "--once", "--runs", "3")
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout.strip().splitlines()[-1]) == {"device": name, "reports": 1}, got.stderr
            assert "ok, p50" in got.stderr
        stdout, stderr = waiting.communicate(timeout=240)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, stderr
    out = json.loads(stdout)
    cell = out["account"]["socs"]["SM8650"]
    assert out["moved"] is True and out["previous"] == before and sorted(cell["devices"]) == ["sim-a", "sim-b"]
    got = farm(lab, *argv, "--to", "beta")
    assert got.returncode == 3 and "error[promotion-unmet]" in got.stderr and "simulator" in got.stderr, got.stderr

    # Gated: a plain move refuses, the history says who moved it on which evidence; rollback.
    got = farm(lab, "tag", "mm:stable", before, "--force")
    assert got.returncode != 0 and "error[tag-gated]" in got.stderr, got.stderr
    hist = json.loads(farm(lab, "tag", "--history", "mm:stable", "--json").stdout)
    (promo,) = hist["promotions"]
    assert promo["by"] == "ops" and promo["allow_simulator"] is True and sorted(promo["devices"]["SM8650"]) == [
        "sim-a", "sim-b"]
    got = farm(lab, "promote", "--rollback", "mm:stable", "--server", lab["url"], "--token", lab["admin"])
    assert got.returncode == 0 and "rolled back" in got.stdout, got.stderr
    assert json.loads(farm(lab, "tag", "--history", "mm:stable", "--json").stdout)["digest"] == before
    got = farm(lab, "tag", "mm:stable", "mm:cand", "--force")
    assert got.returncode != 0 and "error[tag-gated]" in got.stderr, got.stderr

    # Revoking a device strikes its report: the evidence no longer holds.
    assert farm(lab, "device", "revoke", "sim-b").returncode == 0
    status, body = call(lab, "POST", "/v1/promotions", lab["admin"], {**ask, "allow_simulator": True})
    assert status == 409 and body["account"]["socs"]["SM8650"]["devices"] == ["sim-a"], body

    got = farm(lab, "tag", "--ungate", "mm:stable")
    assert got.returncode == 0 and "ungated" in got.stdout
    hist = json.loads(farm(lab, "tag", "--history", "mm:stable", "--json").stdout)
    assert [p["kind"] for p in hist["promotions"]] == ["promote", "rollback", "ungate"]
    assert farm(lab, "tag", "mm:stable", "mm:cand", "--force").returncode == 0


def _key() -> tuple[Any, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return key, base64.b64encode(raw).decode()


def _enroll(lab: dict[str, Any], name: str, soc: str = "simulator", arch: str = "x86_64") -> dict[str, Any]:
    key, pub = _key()
    status, body = call(lab, "POST", "/v1/devices/enroll", enroll_token(lab, name),
                        {"public_key": pub, "soc": soc, "facts": {"arch": arch}})
    assert status == 201, body
    return {**body, "key": key}


def _report(lab: dict[str, Any], dev: dict[str, Any], job: dict[str, Any], *, key: Any = None,
            **over: Any) -> tuple[int, Any]:
    from farm.core.signed_reports import canonical, message

    body = {"job": job["job"], "nonce": job["nonce"], "device": dev["name"], "artifact": job["artifact"],
            "soc": job["soc"], "outcome": "ok", "psnr_db": 70.0, "p50_ms": 1.5, **over}
    text = canonical(body)
    sig = base64.b64encode((key or dev["key"]).sign(message(text))).decode()
    return call(lab, "POST", f"/v1/device-jobs/{job['job']}/report", dev["token"], {"body": text, "signature": sig})


def test_report_attacks_are_refused(lab_any: dict[str, Any]) -> None:
    lab = lab_any
    a = _enroll(lab, "sim-a")
    b = _enroll(lab, "sim-b")
    phone = _enroll(lab, "phone", soc="SM8650", arch="arm64-v8a")
    assert phone["soc"] == "SM8650" and phone["simulator"] is False
    # An x86_64 host can't enroll as a device.
    key, pub = _key()
    status, body = call(lab, "POST", "/v1/devices/enroll", enroll_token(lab, "liar"),
                        {"public_key": pub, "soc": "SM8650", "facts": {"arch": "x86_64"}})
    assert status == 422 and body["error"]["code"] == "not-device-evidence"
    status, _ = call(lab, "POST", "/v1/promotions", lab["admin"], {"model": "mm:cand", "to": "stable",
                                                                   "require": "devices>=2 per soc"})
    assert status == 409
    # A job is taken by one agent: the second gets the other slot, a third nothing.
    status, job_a = call(lab, "POST", "/v1/device-jobs/lease", a["token"], {})
    assert status == 200
    status, job_b = call(lab, "POST", "/v1/device-jobs/lease", b["token"], {})
    assert status == 200 and job_b["job"] != job_a["job"]
    assert call(lab, "POST", "/v1/device-jobs/lease", phone["token"], {})[0] == 204
    # A plain read token is no device; nor is no token.
    reader = token(lab["settings"], "reader", "read")
    assert call(lab, "POST", "/v1/device-jobs/lease", reader, {})[1]["error"]["code"] == "forbidden"
    assert call(lab, "POST", "/v1/device-jobs/lease", None, {})[0] == 401

    # The holder keeps its lease; nobody else can.
    status, body = call(lab, "POST", f"/v1/device-jobs/{job_a['job']}/renew", a["token"], {"nonce": job_a["nonce"]})
    assert status == 200 and body["lease_until"] >= job_a["lease_until"] and job_a["lease_s"] == 600
    status, body = call(lab, "POST", f"/v1/device-jobs/{job_a['job']}/renew", b["token"], {"nonce": job_a["nonce"]})
    assert status == 409 and body["error"]["code"] == "lease-lost"

    forged, _ = _key()  # an unenrolled key
    status, body = _report(lab, a, job_a, key=forged)
    assert status == 403 and body["error"]["code"] == "report-signature-invalid"
    status, body = _report(lab, b, job_a)  # b reporting on a's lease
    assert status == 409 and body["error"]["code"] == "report-replayed"
    status, body = _report(lab, a, job_a, nonce="0" * 32)  # a nonce that is not the lease's
    assert status == 409 and body["error"]["code"] == "report-replayed"
    status, first = _report(lab, a, job_a)
    assert status == 201 and first["created"] is True
    status, again = _report(lab, a, job_a)  # the same signed report: answered, not counted twice
    assert status == 200 and again["id"] == first["id"] and again["created"] is False
    status, body = _report(lab, a, job_a, p50_ms=0.1)  # another body on the same nonce
    assert status == 409 and body["error"]["code"] == "report-replayed"
    status, body = _report(lab, a, {**job_b})  # a's key, b's job
    assert status == 409 and body["error"]["code"] == "report-replayed"

    # A device reports a SoC other than the one it enrolled.
    status, _ = call(lab, "POST", "/v1/device-jobs/lease", phone["token"], {})
    assert status == 204  # both SM8650 slots are leased or done
    farm(lab, "device", "revoke", "sim-b")  # b's lease goes back to the queue
    status, job_p = call(lab, "POST", "/v1/device-jobs/lease", phone["token"], {})
    assert status == 200 and job_p["soc"] == "SM8650"
    status, body = _report(lab, phone, job_p, soc="SM8750")
    assert status == 422 and body["error"]["code"] == "report-soc-mismatch"
    # The revoked device can do nothing more.
    status, body = call(lab, "POST", "/v1/device-jobs/lease", b["token"], {})
    assert body["error"]["code"] in ("unauthorized", "device-revoked")  # the token cache: within 5 s
    status, _ = _report(lab, phone, job_p)
    assert status == 201
    status, body = call(lab, "GET", "/v1/devices", lab["admin"])
    assert {d["name"]: d["state"] for d in body["devices"]}["sim-b"] == "revoked"
    # Enrollment tokens over HTTP: admin only; the token works once.
    assert call(lab, "POST", "/v1/devices", reader, {"name": "remote"})[0] == 403
    status, made = call(lab, "POST", "/v1/devices", lab["admin"], {"name": "remote", "expires": "5m"})
    assert status == 201 and made["token"].startswith("cfe_")
    enrolling = {"public_key": _key()[1], "soc": "simulator", "facts": {"arch": "x86_64"}}
    assert call(lab, "POST", "/v1/devices/enroll", None, enrolling)[0] == 401  # no token
    assert call(lab, "POST", "/v1/devices/enroll", made["token"], enrolling)[0] == 201
    status, body = call(lab, "POST", "/v1/devices/enroll", made["token"], {**enrolling, "public_key": _key()[1]})
    assert status == 401 and body["error"]["code"] == "enrollment-invalid"
    status, body = call(lab, "POST", "/v1/devices/enroll", lab["admin"], {**enrolling, "public_key": _key()[1]})
    assert status == 401 and body["error"]["code"] == "enrollment-invalid"  # an API token enrolls nothing
    status, body = call(lab, "DELETE", "/v1/devices/remote", lab["admin"])
    assert status == 200 and body == {"revoked": "remote", "struck": 0}


def test_lease_race_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    """Eight agents ask at once for one job: one gets it (guarded UPDATE; PostgreSQL, real rows)."""
    from registry.devices import create_enrollment, enroll
    from registry.index import Registry
    from registry.verification import ensure_jobs, lease

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": pg_url,
                                  "FARM_STORE_URL": f"file://{tmp_path / 'blobs'}"})
    model = matmul_model(tmp_path / "mm.onnx")
    (o,) = build(settings, model, ["qnn:SM8650"], name="mm", tag="cand").outcomes
    reg = Registry.open(settings)
    try:
        devices = []
        with reg.db.session() as s:
            from registry.index import find_artifact

            art = find_artifact(s, o.artifact)
            ensure_jobs(s, art.id, "SM8650", 1)
            for i in range(8):
                tok = create_enrollment(s, f"sim-{i}").token
                devices.append(enroll(s, tok, _key()[1], "simulator", {"arch": "x86_64"})[0].id)
        got: list[Any] = []
        barrier = threading.Barrier(len(devices))

        def take(device_id: int) -> None:
            from registry.models import Device

            with reg.db.session() as s:
                dev = s.get(Device, device_id)
                barrier.wait()
                got.append(lease(s, dev))

        threads = [threading.Thread(target=take, args=(d,)) for d in devices]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(got) == 8 and sum(g is not None for g in got) == 1
    finally:
        reg.close()


def test_a_running_agent_takes_a_job_made_while_it_waits(lab: dict[str, Any]) -> None:
    """`ctxfarm-agent run` (no --once) long-polls: a job made after it started reaches it, runs on
    the model's sample inputs (the submitter's .npz), and a local `farm promote --wait` moves the
    tag once its report is in."""
    import io

    import numpy as np

    digest = json.loads(farm(lab, "tag", "--history", "mm:cand", "--json").stdout)["digest"]
    buf = io.BytesIO()
    np.savez(buf, x=np.full((1, 64), 0.25, np.float32))
    req = urllib.request.Request(f"{lab['url']}/v1/models/{digest}/samples", data=buf.getvalue(), method="POST",
                                 headers={"Authorization": f"Bearer {token(lab['settings'], 'pipeline', 'submit')}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        samples = json.loads(r.read())["samples"]
    home = lab["tmp"] / "agent"
    got = agent(lab, "enroll", "--server", lab["url"], "--token", enroll_token(lab, "sim-w"), "--home", str(home))
    assert got.returncode == 0, got.stderr
    proc = subprocess.Popen([sys.executable, "-m", "workers.agent.main", "run", "--home", str(home), "--runs", "2"],
                            env=lab["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ask = {"model": "mm:cand", "to": "stable", "require": "devices>=1 per soc", "allow_simulator": True}
        status, body = call(lab, "POST", "/v1/promotions", lab["admin"], ask)
        assert status == 409 and body["account"]["socs"]["SM8650"]["jobs_open"] == 1
        got = farm(lab, "promote", "mm:cand", "--to", "stable", "--require", "devices>=1 per soc", "--allow-simulator",
                   "--wait", "--timeout", "110", "--json")
        assert got.returncode == 0, (got.stderr, proc.stderr.read() if proc.poll() is not None else "")
        assert json.loads(got.stdout)["account"]["socs"]["SM8650"]["devices"] == ["sim-w"]
        from registry.index import Registry
        from registry.models import DeviceVerification

        reg = Registry.open(lab["settings"])
        try:
            with reg.db.session() as s:
                (row,) = s.query(DeviceVerification).all()
                assert row.body["inputs"] == samples and row.outcome == "ok" and row.psnr_db > 30, row.body
        finally:
            reg.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_running_agent_outlives_an_unreachable_service(lab: dict[str, Any]) -> None:
    """`run` (no --once) asks an unreachable service again with a backoff instead of exiting;
    `run --once` exits with server-error."""
    home = lab["tmp"] / "agent"
    got = agent(lab, "enroll", "--server", lab["url"], "--token", enroll_token(lab, "sim-o"), "--home", str(home))
    assert got.returncode == 0, got.stderr
    nowhere = f"http://127.0.0.1:{_port()}"
    once = agent(lab, "run", "--home", str(home), "--server", nowhere, "--once")
    assert once.returncode == 1 and "error[server-error]" in once.stderr, once.stderr
    proc = subprocess.Popen([sys.executable, "-m", "workers.agent.main", "run", "--home", str(home), "--server",
                             nowhere], env=lab["env"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend([proc.stderr.readline(), proc.stderr.readline()]),
                                  daemon=True)
        reader.start()
        reader.join(timeout=60)  # the first two tries: at once, then after 1 s
        assert len(lines) == 2 and all("asking again in" in line for line in lines), lines
        assert proc.poll() is None  # still running
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_agent_that_hung_up_takes_no_job(lab: dict[str, Any]) -> None:
    """A lease's long poll ends when its agent hangs up: a job made after that stays open for the
    next agent (a stopped agent would never run it), and no request is left for a shutdown to
    wait on."""
    import http.client
    import time

    gone, other = _enroll(lab, "sim-gone"), _enroll(lab, "sim-next")
    port = int(lab["url"].rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/device-jobs/lease", body=json.dumps({"wait_s": 20}),
                 headers={"Authorization": f"Bearer {gone['token']}", "Content-Type": "application/json"})
    time.sleep(0.5)  # the request is in, waiting
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    status, _ = call(lab, "POST", "/v1/promotions", lab["admin"], {"model": "mm:cand", "to": "stable",
                                                                   "require": "devices>=1 per soc"})
    assert status == 409  # the job is made now
    time.sleep(2.5)  # more than two looks of the hung-up wait
    status, job = call(lab, "POST", "/v1/device-jobs/lease", other["token"], {})
    assert status == 200 and job["soc"] == "SM8650", job


def _samples(lab: dict[str, Any], name: str, value: float) -> Path:
    import numpy as np

    path = lab["tmp"] / f"{name}.npz"
    np.savez(path, x=np.full((1, 64), value, np.float32))
    return path


def _sample_row(lab: dict[str, Any]) -> Any:
    from registry.index import Registry
    from registry.models import ModelSample

    reg = Registry.open(lab["settings"])
    try:
        with reg.db.session() as s:
            (row,) = s.query(ModelSample).all()
            s.expunge(row)
            return row
    finally:
        reg.close()


def _reports(lab: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from registry.index import Registry
    from registry.models import Device, DeviceVerification

    reg = Registry.open(lab["settings"])
    try:
        with reg.db.session() as s:
            return {name: dict(row.body) for row, name in s.query(DeviceVerification, Device.name)
                    .join(Device, Device.id == DeviceVerification.device_id)}
    finally:
        reg.close()


def test_agents_compare_against_the_stored_cpu_reference(lab: dict[str, Any]) -> None:
    """A build with samples keeps the CPU reference outputs (a blob, made by the accuracy check in the
    worker env) and an agent compares against it (`reference: stored`); a tampered reference blob is
    refused (`fails`, never trusted); a reference over FARM_REFERENCE_MAX_BYTES is not kept, why is
    recorded, and the agent computes its own on the device's CPU (`reference: device-cpu`)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = lab["tmp"] / "mm.onnx"
    got = farm(lab, "build", str(model), "-t", "qnn:SM8650", "--samples", str(_samples(lab, "a", 0.25)))
    assert got.returncode == 0, got.stderr
    row = _sample_row(lab)
    assert row.reference_digest and row.reference_why is None, (row.reference_digest, row.reference_why)
    blob = lab["tmp"] / "blobs" / "blobs" / "sha256" / row.reference_digest[7:9] / row.reference_digest[7:]
    assert blob.stat().st_size == row.reference_size
    w = numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0])
    with np.load(blob, allow_pickle=False) as z:
        assert z["names"].tolist() == ["y"]
        np.testing.assert_allclose(z["out0"], np.full((1, 64), 0.25, np.float32) @ w, rtol=1e-5)

    status, body = call(lab, "POST", "/v1/promotions", lab["admin"], {"model": "mm:cand", "to": "stable",
                                                                      "require": "devices>=3 per soc"})
    assert status == 409 and body["account"]["socs"]["SM8650"]["jobs_open"] == 3, body
    homes = []
    for name in ("sim-s", "sim-t", "sim-c"):
        home = lab["tmp"] / f"agent-{name}"
        got = agent(lab, "enroll", "--server", lab["url"], "--token", enroll_token(lab, name), "--home", str(home))
        assert got.returncode == 0, got.stderr
        homes.append(home)

    from registry.index import Registry
    from registry.verify import referenced_digests

    reg = Registry.open(lab["settings"])
    try:
        with reg.db.session() as s:  # garbage collection keeps the samples and their reference
            assert {row.digest, row.reference_digest} <= referenced_digests(s)
    finally:
        reg.close()
    got = agent(lab, "run", "--home", str(homes[0]), "--once", "--runs", "2")
    assert got.returncode == 0 and "ok, p50" in got.stderr, got.stderr
    stored = _reports(lab)["sim-s"]
    assert stored["reference"] == "stored" and stored["outcome"] == "ok" and stored["psnr_db"] > 30, stored
    assert "reference_why" not in stored

    # The same size, other bytes: the agent's verified download refuses it and nothing is compared.
    blob.chmod(0o644)
    blob.write_bytes(bytes(b ^ 0xFF for b in blob.read_bytes()))
    got = agent(lab, "run", "--home", str(homes[1]), "--once", "--runs", "2")
    assert got.returncode == 0 and ": fails" in got.stderr, got.stderr
    refused = _reports(lab)["sim-t"]
    assert refused["outcome"] == "fails" and refused["reference"] == "stored" and "psnr_db" not in refused
    assert "refused" in refused["error"] and "does not match its digest" in refused["error"], refused

    # New samples, a bound their outputs (256 bytes) are over: not kept, the reason recorded.
    env = {**lab["env"], "FARM_REFERENCE_MAX_BYTES": "100"}
    got = subprocess.run([sys.executable, "-m", "farm.cli", "build", str(model), "-t", "qnn:SM8650", "--samples",
                          str(_samples(lab, "b", 0.5))], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    row = _sample_row(lab)
    assert row.reference_digest is None and "over FARM_REFERENCE_MAX_BYTES (100)" in row.reference_why
    got = agent(lab, "run", "--home", str(homes[2]), "--once", "--runs", "2")
    assert got.returncode == 0 and "ok, p50" in got.stderr, got.stderr
    own = _reports(lab)["sim-c"]
    assert own["reference"] == "device-cpu" and own["psnr_db"] > 30 and own["inputs"] == row.digest, own
    assert "FARM_REFERENCE_MAX_BYTES" in own["reference_why"], own


def test_group_and_llm_package_jobs_flow_with_fixture_reports(lab: dict[str, Any]) -> None:
    """A graph group and an LLM genai package (each a real QNN compile of weight-shared contexts,
    which the simulator cannot load) go through the job flow: `farm promote` makes their jobs, an
    agent that says it runs their kind leases them (an agent that runs plain contexts is not
    offered them), the LLM lease carries the twin's reference tokens, a fixture report signed as
    an agent signs it is accepted, and the promotion moves on it."""
    from farm.pipeline.genai import record_twin
    from registry.index import Registry
    from registry.models import DeviceVerification
    from tests.common.genai import make_export
    from tests.common.groups import prefill_decode

    prefill, decode = prefill_decode(lab["tmp"] / "g")
    got = farm(lab, "build", "--graph", f"prefill={prefill}", "--graph", f"decode={decode}", "-t", "qnn:SM8650",
               "--name", "grp", "--tag", "cand", "--json")
    assert got.returncode == 0, got.stderr
    got = farm(lab, "build", "--genai", str(make_export(lab["tmp"] / "export")), "-t", "qnn:SM8650", "--name", "llm",
               "--tag", "cand", "--no-twin", "--json")
    assert got.returncode == 0, got.stderr
    (pkg,) = json.loads(got.stdout)["builds"]
    # The twin's record as the build makes it (a fixture here: the twin itself is tested in test_genai_twin).
    reg = Registry.open(lab["settings"])
    try:
        record_twin(reg, pkg["artifact"], {"status": "ok", "prompt": "Hello", "reference_tokens": [5, 9, 2, 7],
                                           "tokens_compared": 4, "tokens_matched": 4})
    finally:
        reg.close()

    for model in ("grp", "llm"):
        status, body = call(lab, "POST", "/v1/promotions", lab["admin"], {"model": f"{model}:cand", "to": "stable",
                                                                          "require": "devices>=1 per soc"})
        assert status == 409 and body["account"]["socs"]["SM8650"]["jobs_open"] == 1, body
    dev = _enroll(lab, "sim-g")
    assert call(lab, "POST", "/v1/device-jobs/lease", dev["token"], {})[0] == 204  # a context agent: none of these
    status, body = call(lab, "POST", "/v1/device-jobs/lease", dev["token"], {"kinds": ["tensorrt"]})
    assert status == 400 and body["error"]["code"] == "usage", body
    status, job_g = call(lab, "POST", "/v1/device-jobs/lease", dev["token"], {"kinds": ["group"]})
    assert status == 200 and job_g["kind"] == "group" and job_g["reference_tokens"] is None, job_g
    assert job_g["samples"] is None and job_g["reference"] is None and "no sample inputs" in job_g["reference_why"]
    status, job_l = call(lab, "POST", "/v1/device-jobs/lease", dev["token"], {"kinds": ["genai-package", "group"]})
    assert status == 200 and job_l["kind"] == "genai-package" and job_l["artifact"] == pkg["artifact"], job_l
    assert job_l["reference_tokens"] == {"prompt": "Hello", "tokens": [5, 9, 2, 7]}

    # What a device's agent would send: every graph of the group measured, the worst PSNR; the
    # LLM's greedy tokens against the twin's.
    status, body = _report(lab, dev, job_g, reference="stored", psnr_db=61.5, p50_ms=3.2)
    assert status == 201 and body["outcome"] == "ok", body
    status, body = _report(lab, dev, job_l, psnr_db=None, tokens_compared=4, tokens_matched=5)
    assert status == 400 and "tokens_matched" in body["error"]["message"], body
    status, body = _report(lab, dev, job_l, psnr_db=None, reference="stored", tokens_compared=4, tokens_matched=4,
                           p50_ms=41.0)
    assert status == 201 and body["tokens_matched"] == 4 and body["reference"] == "stored", body

    for model in ("grp", "llm"):
        status, body = call(lab, "POST", "/v1/promotions", lab["admin"], {
            "model": f"{model}:cand", "to": "stable", "require": "devices>=1 per soc", "allow_simulator": True})
        assert status == 200 and body["met"] is True and body["changed"] is True, body
        assert body["account"]["socs"]["SM8650"]["devices"] == ["sim-g"], body
    reg = Registry.open(lab["settings"])
    try:
        with reg.db.session() as s:
            rows = {r.job_id: r for r in s.query(DeviceVerification).all()}
            assert rows[job_l["job"]].body["tokens_matched"] == 4 and rows[job_l["job"]].psnr_db is None
            assert rows[job_g["job"]].psnr_db == 61.5
    finally:
        reg.close()
