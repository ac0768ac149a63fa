"""The hostile corpus (tests/common/hostile_requests.py), against the real service (`farm serve`, and the in-process app on
SQLite and PostgreSQL) and the real CLI: no request outgrows its budget before auth, no token
touches what another owns, archives of sample inputs fail cleanly, and the CLI leaves nothing
behind. Each class is refused with a documented 4xx code, no 5xx, no traceback, memory bounded,
nothing left behind and the registry unchanged."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core import errors
from farm.core.settings import Settings
from infra.devfarm.services import free_port
from tests.common.accuracy_models import matmul_model
from tests.common.cli import farm
from tests.common.groups import prefill_decode
from tests.common.hostile_archives import bad_crc, many_entries
from tests.common.hostile_requests import peak_rss_mib, route_requests, send
from tests.common.onnx_models import conv_relu_add
from tests.common.procs import at_once
from tests.common.registry_state import snapshot
from tests.common.service import serve, token

DOCUMENTED = {cls.code for cls in vars(errors).values()
              if isinstance(cls, type) and issubclass(cls, errors.FarmError) and cls is not errors.FarmError}
HUGE = 96 * 1024 * 1024  # the body: +192 MiB of service memory before its 401
CHUNKED = 8 * 1024 * 1024  # over every cap but the sample inputs' (64 MiB, streamed to disk)


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def code_of(answer: Any) -> str:
    body = answer.json() if hasattr(answer, "json") else json.loads(answer)
    assert body["error"]["code"] in DOCUMENTED, body
    return str(body["error"]["code"])


# ---- every route: the token before the body, the body within its cap, memory bounded ------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("bounded-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(home), "FARM_MAX_UPLOAD_MB": "4"})
    settings = Settings.from_env(env)
    tokens = {scope: token(settings, f"t-{scope}", scope) for scope in ("read", "submit", "admin", "report")}
    port = free_port()
    log = home / "serve.log"
    proc = serve(env, port, log)
    try:
        yield {"port": port, "pid": proc.pid, "tokens": tokens, "settings": settings, "log": log, "home": home}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_every_route_checks_the_token_first_and_reads_at_most_its_cap(served: dict[str, Any]) -> None:
    """Every route of the app (enumerated from it): a 96 MiB body with no token is 401 before a
    byte of it is read (the issue: +192 MiB before the 401); with an admin token, declared over
    the route's cap it is 413 at once, chunked it is read up to the cap at most. The service's
    peak memory stays within a few MiB of what it was, nothing is written, no 5xx, no traceback."""
    port, admin = served["port"], served["tokens"]["admin"]
    routes = route_requests(create_app(served["settings"]))
    assert len(routes) >= 30 and ("POST", "/v1/releases") in routes and ("POST", "/v1/groups") in routes
    for method, path in routes:  # warm-up: every route's imports loaded, its first answer given
        status, answer = send(port, method, path, auth(admin), 0, chunked=False)
        assert status and status != 500, (method, path, answer[:300])
    before, baseline = snapshot(served["settings"]), peak_rss_mib(served["pid"])
    uploads = sorted(p.name for p in (served["home"] / "uploads").iterdir())
    for method, path in routes:
        # /v1 routes: refused (401 first, then too-large; not-found for an id that does not exist);
        # the API document and the probes read no body and answer as ever.
        api = path.startswith("/v1/")
        status, answer = send(port, method, path, {"Content-Type": "application/json"}, HUGE, chunked=False)
        assert status == 401 if api else 0 < status < 500, (method, path, answer[:300])
        status, answer = send(port, method, path, {**auth(admin), "Content-Type": "application/json"}, HUGE,
                              chunked=False)
        assert (status == 413 and b'"too-large"' in answer) if api else 0 < status < 500, (method, path, answer[:300])
        status, answer = send(port, method, path, {**auth(admin), "Content-Type": "application/json"}, CHUNKED,
                              chunked=True)
        assert 400 <= status < 500 if api else 0 < status < 500, (method, path, answer[:300])
    grown = peak_rss_mib(served["pid"]) - baseline
    print(f"{len(routes)} routes x (96 MiB no token, 96 MiB declared, 8 MiB chunked): peak RSS +{grown:.1f} MiB")
    assert grown < 48, f"the service's peak memory grew {grown:.1f} MiB"
    assert snapshot(served["settings"]) == before
    assert sorted(p.name for p in (served["home"] / "uploads").iterdir()) == uploads  # no upload-* left
    assert "Traceback" not in served["log"].read_text()


def test_a_token_in_the_url_is_refused_on_every_route(served: dict[str, Any]) -> None:
    """``?token=`` with a good header beside it: 401 on every route but the coverage page (the
    issue: POST /v1/reports?token=... was accepted)."""
    port, tokens = served["port"], served["tokens"]
    for method, path in route_requests(create_app(served["settings"])):
        if path == "/coverage":
            continue
        tok = tokens["report"] if path == "/v1/reports" and method == "POST" else tokens["admin"]
        sep = "&" if "?" in path else "?"
        # The name spelled plainly, percent-encoded (decoded to `token` by the query parser), and
        # after another parameter: the guard's quick look at the query string must not miss any.
        for query in (f"token={tok}", f"%74oken={tok}", f"x=1&%74%6F%6B%65%6E={tok}"):
            status, answer = send(port, method, f"{path}{sep}{query}", auth(tok), 0, chunked=False)
            assert status == 401, (method, path, query, answer[:300])
            assert b"in the URL" in answer


# ---- quotas and ownership, in-process, on SQLite and PostgreSQL ------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def app_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    env = {"FARM_HOME": str(tmp_path / "home"), "FARM_MAX_UPLOAD_MB": "4", "FARM_QUOTA_UPLOADS": "2",
           "FARM_QUOTA_UPLOAD_MB": "1", "FARM_QUOTA_RELEASES": "1"}
    if request.param == "postgres":
        env["FARM_DATABASE_URL"] = request.getfixturevalue("pg_url")
    return env


def _client(settings: Settings) -> tuple[TestClient, dict[str, str]]:
    names = {"a": "submit", "b": "submit", "c": "submit", "admin": "admin"}
    tokens = {name: token(settings, name, scope) for name, scope in names.items()}
    return TestClient(create_app(settings)), tokens


def test_upload_sessions_are_owned_and_held_to_per_token_quotas(app_env: dict[str, str]) -> None:
    settings = Settings.from_env(app_env)
    client, t = _client(settings)
    with client:
        mine = [client.post("/v1/uploads", headers=auth(t["a"])).json()["upload"] for _ in range(2)]
        third = client.post("/v1/uploads", headers=auth(t["a"]))
        assert third.status_code == 429 and code_of(third) == "quota-uploads" and third.headers["Retry-After"]
        theirs = client.post("/v1/uploads", headers=auth(t["b"]))  # one token's quota blocks no other
        assert theirs.status_code == 201

        # Another token: the session does not exist for it (404, as an unknown id), and nothing changes.
        s1, s2 = mine
        for method, path, extra in (("GET", f"/v1/uploads/{s1}", {}),
                                    ("PATCH", f"/v1/uploads/{s1}", {"Upload-Offset": "0"}),
                                    ("POST", f"/v1/uploads/{s1}/complete", {})):
            r = client.request(method, path, headers={**auth(t["b"]), **extra}, content=b"x" * 10 if extra else None)
            assert r.status_code == 404 and code_of(r) == "not-found", (method, r.text)
        assert client.get(f"/v1/uploads/{s1}", headers=auth(t["a"])).json()["offset"] == 0
        assert client.get(f"/v1/uploads/{s1}", headers=auth(t["admin"])).status_code == 200  # an admin may

        # Bytes held: 600 KiB in one session, 600 more in the other is past the 1 MiB quota.
        piece = os.urandom(600 * 1024)
        r = client.patch(f"/v1/uploads/{s1}", headers={**auth(t["a"]), "Upload-Offset": "0"}, content=piece)
        assert r.status_code == 200 and r.json()["offset"] == len(piece)
        r = client.patch(f"/v1/uploads/{s2}", headers={**auth(t["a"]), "Upload-Offset": "0"}, content=piece)
        assert r.status_code == 429 and code_of(r) == "quota-upload-bytes", r.text
        assert client.get(f"/v1/uploads/{s2}", headers=auth(t["a"])).json()["offset"] == 0  # refused whole

        # Abandoned sessions expire: their rows and bytes go, and the quota is free again.
        from sqlalchemy import update

        from registry.index import Registry
        from registry.models import UploadSession

        old = datetime.now(UTC) - timedelta(seconds=settings.upload_ttl_s + 60)
        reg = Registry.open(settings)
        with reg.db.session() as s:
            s.execute(update(UploadSession).where(UploadSession.id.in_(mine)).values(touched_at=old))
        r = client.post("/v1/uploads", headers=auth(t["a"]))
        assert r.status_code == 201, r.text
        with reg.db.session() as s:
            assert s.get(UploadSession, s1) is None and s.get(UploadSession, s2) is None
        reg.close()
        assert not (settings.home / "uploads" / f"session-{s1}").exists()
        assert client.get(f"/v1/uploads/{s1}", headers=auth(t["a"])).status_code == 404


def test_blobs_a_token_sends_count_against_its_bytes_quota_until_a_model_uses_them(
        app_env: dict[str, str], tmp_path: Path) -> None:
    """PUT /v1/blobs had no per-token bound but the per-request cap: a token could fill the store
    up to the gc's grace window. What it stored that no model references counts with its upload
    sessions (FARM_QUOTA_UPLOAD_MB: 1 MiB here); a model recorded from the blobs frees them."""
    from farm.core.keys import sha256_bytes
    from tests.common.onnx_models import conv_relu_add

    settings = Settings.from_env(app_env)
    client, t = _client(settings)
    model = conv_relu_add(tmp_path / "m.onnx", seed=11).read_bytes()
    pad = 700 * 1024 - len(model)
    assert pad > 0
    filler = os.urandom(pad)  # with the model: 700 KiB of the token's 1 MiB
    with client:
        def put(data: bytes, who: str = "a") -> Any:
            return client.put(f"/v1/blobs/{sha256_bytes(data)}", headers=auth(t[who]), content=data)

        assert put(model).status_code == 200 and put(filler).status_code == 200
        more = os.urandom(400 * 1024)
        r = put(more)
        assert r.status_code == 429 and code_of(r) == "quota-upload-bytes" and r.headers["Retry-After"], r.text
        assert client.head(f"/v1/blobs/{sha256_bytes(more)}", headers=auth(t["a"])).status_code == 404  # not stored
        assert put(model).json()["held"] is True  # a blob held already costs nothing
        # One token's quota blocks no other; an open session's bytes count with the blobs.
        assert put(more, "b").status_code == 200
        upload = client.post("/v1/uploads", headers=auth(t["a"])).json()["upload"]
        r = client.patch(f"/v1/uploads/{upload}", headers={**auth(t["a"]), "Upload-Offset": "0"},
                         content=os.urandom(400 * 1024))
        assert r.status_code == 429 and code_of(r) == "quota-upload-bytes", r.text
        # A model recorded from its blob: that blob no longer counts, the next one fits.
        from farm.core.digests import local_bundle

        bundle_digest = local_bundle(tmp_path / "m.onnx", None).digest
        r = client.post(f"/v1/models/{bundle_digest}", headers=auth(t["a"]),
                        json={"files": [{"path": "model.onnx", "digest": sha256_bytes(model), "size": len(model)}]})
        assert r.status_code == 200 and r.json()["digest"] == bundle_digest, r.text
        small = os.urandom(300 * 1024)
        assert put(small).status_code == 200, "the model's blob still counted"
        assert put(os.urandom(100 * 1024)).status_code == 429  # the filler still does: 700 + 300 + 100 KiB


def test_a_blob_is_freed_by_any_upload_of_a_model_that_holds_it(app_env: dict[str, str], tmp_path: Path) -> None:
    """A blob one token stored with PUT /v1/blobs stops counting once a model holding it is
    recorded however it came: here another token's plain POST /v1/models of the same bytes (it
    was counted until FARM_UPLOAD_TTL_S before)."""
    from farm.core.keys import sha256_bytes
    from tests.common.onnx_models import matmul_add

    settings = Settings.from_env(app_env)
    client, t = _client(settings)
    model = matmul_add(seed=5, size=360).SerializeToString()  # ~0.5 MiB of weights inline
    filler = os.urandom(900 * 1024 - len(model))
    assert len(model) > 400 * 1024 and len(filler) > 0
    with client:
        def put(data: bytes) -> Any:
            return client.put(f"/v1/blobs/{sha256_bytes(data)}", headers=auth(t["a"]), content=data)

        assert put(model).status_code == 200 and put(filler).status_code == 200
        more = os.urandom(200 * 1024)
        assert put(more).status_code == 429  # 900 + 200 KiB over a's 1 MiB
        up = client.post("/v1/models?name=shared&tag=v1",
                         headers={**auth(t["b"]), "Content-Type": "application/octet-stream"}, content=model)
        assert up.status_code == 200, up.text
        assert put(more).status_code == 200, "the blob a model now holds still counted against a"
        assert put(os.urandom(500 * 1024)).status_code == 429  # the filler and `more` still do


def test_releases_are_owned_quota_bound_and_a_shared_build_outlives_one_cancel(
        app_env: dict[str, str], redis_server: str, tmp_path: Path) -> None:
    """Two tokens release the same model on the same target: one build, wanted by both. Another
    token cannot cancel a release (404); the owner's cancel keeps the build the other release
    still wants; the last cancel stops it. FARM_QUOTA_RELEASES=1 holds a token to one release in
    progress (429 quota-releases), freed by its cancel."""
    settings = Settings.from_env({**app_env, "FARM_BROKER_URL": redis_server})
    client, t = _client(settings)
    model = conv_relu_add(tmp_path / "m.onnx").read_bytes()
    with client:
        up = client.post("/v1/models", headers={**auth(t["a"]), "Content-Type": "application/octet-stream"},
                         content=model)
        assert up.status_code == 200, up.text
        body = {"model": up.json()["digest"], "targets": ["qnn:SM8650"], "sdks": ["2.51.0"], "allow_queue": True}
        ra = client.post("/v1/releases", headers=auth(t["a"]), json=body).json()
        rb = client.post("/v1/releases", headers=auth(t["b"]), json=body).json()
        (build,) = {b["build"] for b in ra["builds"]} | {b["build"] for b in rb["builds"]}
        over = client.post("/v1/releases", headers=auth(t["a"]), json={**body, "targets": ["qnn:SM8750"]})
        assert over.status_code == 429 and code_of(over) == "quota-releases", over.text

        r = client.post(f"/v1/releases/{ra['release']}/cancel", headers=auth(t["b"]))
        assert r.status_code == 404 and code_of(r) == "not-found"
        r = client.post(f"/v1/builds/{build}/cancel", headers=auth(t["c"]))  # wants it through no release
        assert r.status_code == 404 and code_of(r) == "not-found"
        r = client.post(f"/v1/builds/{build}/cancel", headers=auth(t["b"]))  # a's release still wants it
        assert r.json()["builds"] == [{"build": build, "was": "queued", "now": "kept"}], r.text

        r = client.post(f"/v1/releases/{ra['release']}/cancel", headers=auth(t["a"]))
        assert r.json()["builds"] == [{"build": build, "was": "queued", "now": "kept"}], r.text
        st = client.get(f"/v1/releases/{rb['release']}", headers=auth(t["b"])).json()
        assert not st["done"] and st["builds"][0]["state"] == "queued", st
        again = client.post("/v1/releases", headers=auth(t["a"]), json={**body, "targets": ["qnn:SM8750"]})
        assert again.status_code == 200, again.text  # the cancelled release no longer counts

        r = client.post(f"/v1/releases/{rb['release']}/cancel", headers=auth(t["b"]))
        assert r.json()["builds"] == [{"build": build, "was": "queued", "now": "cancelled"}], r.text
        r = client.post(f"/v1/releases/{again.json()['release']}/cancel", headers=auth(t["admin"]))
        assert r.status_code == 200 and r.json()["builds"][0]["now"] == "cancelled"


def test_quotas_hold_when_requests_come_at_once(app_env: dict[str, str], redis_server: str, tmp_path: Path) -> None:
    """A quota is counted and taken in one step per token: 8 upload sessions asked at once with
    FARM_QUOTA_UPLOADS=2 open exactly 2, and 4 releases at once with FARM_QUOTA_RELEASES=1 queue
    exactly 1; on PostgreSQL through two apps (two service processes share the database's lock)."""
    settings = Settings.from_env({**app_env, "FARM_BROKER_URL": redis_server})
    first, t = _client(settings)
    second = TestClient(create_app(settings)) if settings.database_url.startswith("postgresql") else first
    model = conv_relu_add(tmp_path / "m.onnx").read_bytes()
    with first, second:
        clients = [first, second]
        opened = at_once(8, lambda i: clients[i % 2].post("/v1/uploads", headers=auth(t["a"])))
        assert sorted(r.status_code for r in opened) == [201] * 2 + [429] * 6, [r.text for r in opened]
        assert {code_of(r) for r in opened if r.status_code == 429} == {"quota-uploads"}
        assert len({r.json()["upload"] for r in opened if r.status_code == 201}) == 2

        up = first.post("/v1/models", headers={**auth(t["a"]), "Content-Type": "application/octet-stream"},
                        content=model)
        assert up.status_code == 200, up.text
        socs = ["SM8650", "SM8750", "SM8550", "SC8380XP"]
        body = {"model": up.json()["digest"], "sdks": ["2.51.0"], "allow_queue": True}
        got = at_once(4, lambda i: clients[i % 2].post(
            "/v1/releases", headers=auth(t["a"]), json={**body, "targets": [f"qnn:{socs[i]}"]}))
        assert sorted(r.status_code for r in got) == [200, 429, 429, 429], [r.text for r in got]
        assert {code_of(r) for r in got if r.status_code == 429} == {"quota-releases"}
        (ok,) = [r.json() for r in got if r.status_code == 200]
        r = first.post(f"/v1/releases/{ok['release']}/cancel", headers=auth(t["a"]))
        assert r.status_code == 200, r.text


# ---- archives of sample inputs ---------------------------------------------------------------------

def npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_hostile_sample_archives_are_bad_samples_never_internal_errors(tmp_path: Path) -> None:
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home")})
    client, t = _client(settings)
    x = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    good = npz(x=x)
    with client:
        sub = {**auth(t["a"]), "Content-Type": "application/octet-stream"}
        digest = client.post("/v1/models", headers=sub, content=matmul_model(tmp_path / "m.onnx").read_bytes()
                             ).json()["digest"]
        prefill, decode = prefill_decode(tmp_path / "g")
        graphs = [{"name": n, "model": client.post("/v1/models", headers=sub, content=p.read_bytes()).json()["digest"]}
                  for n, p in (("prefill", prefill), ("decode", decode))]
        group = client.post("/v1/groups", headers=auth(t["a"]), json={"graphs": graphs}).json()["digest"]
        before = snapshot(settings)
        for name, body, where in (("250,000 entries", many_entries(250_000), digest),
                                  ("a bad CRC", bad_crc(good, x), digest),
                                  ("cut short", good[:len(good) // 2], digest),
                                  ("a header past its data", good.replace(b"(1, 64)", b"(9, 64)"), digest),
                                  ("a group's digest", good, group)):
            r = client.post(f"/v1/models/{where}/samples", headers=auth(t["a"]), content=body)
            assert r.status_code == 400 and code_of(r) == "bad-samples", (name, r.text)
            assert r.json()["error"]["hint"], name
        assert snapshot(settings) == before
        r = client.post(f"/v1/models/{digest}/samples", headers=auth(t["a"]), content=good)
        assert r.status_code == 200, r.text


# ---- the CLI: group files, temp directories, blobs of a refused request --------------------------

def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.glob("ctxfarm-group-*"))


def test_cli_group_files_are_depth_capped_and_leave_nothing_behind(settings: Settings, farm_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**farm_env, "TMPDIR": str(tmp)}
    deep = tmp_path / "deep.json"
    deep.write_text('{"graphs": ' + "[" * 100_000 + "]" * 100_000 + "}")
    proc = farm(env, "build", "--group-file", str(deep), "-t", "qnn:SM8650", check=False)
    assert proc.returncode == 2 and "error[bad-group]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr

    # farm build --samples with a damaged .npz: bad-samples (exit 2) before anything is built, not exit 70.
    x = np.random.default_rng(3).standard_normal((1, 64)).astype(np.float32)
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(bad_crc(npz(x=x), x))
    model = matmul_model(tmp_path / "mm.onnx")
    proc = farm(env, "build", str(model), "-t", "qnn:SM8650", "--samples", str(damaged), check=False)
    assert proc.returncode == 2 and "error[bad-samples]" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert json.loads(farm(env, "ls", "--json").stdout) == []

    prefill, decode = prefill_decode(tmp_path / "g")
    graphs = ["--graph", f"prefill={prefill}", "--graph", f"decode={decode}"]
    out = json.loads(farm(env, "build", *graphs, "-t", "qnn:SM8650", "--name", "g", "--tag", "v1", "--json").stdout)
    assert out["ok"] and _leftovers(tmp) == []

    # Another group under the same tag: tag-conflict, and neither a blob nor a temp dir is left.
    before = snapshot(settings)
    other = ["--graph", f"decode={decode}", "--graph", f"prefill={prefill}"]
    proc = farm(env, "build", *other, "-t", "qnn:SM8650", "--name", "g", "--tag", "v1", check=False)
    assert proc.returncode != 0 and "error[tag-conflict]" in proc.stderr, proc.stderr
    assert snapshot(settings) == before and _leftovers(tmp) == []

    # Ctrl-C while the group builds: its temp dir goes too.
    child = subprocess.Popen([sys.executable, "-m", "farm.cli", "build", *graphs, "-t", "qnn:SM8750"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while not _leftovers(tmp) and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert b"Traceback" not in err, err.decode()[-2000:]
    assert _leftovers(tmp) == []
