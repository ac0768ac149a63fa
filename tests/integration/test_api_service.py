"""The service as an attacker and a new user meet it: a flood of long polls against a
real `farm serve` never delays its probes or device reads; archive bombs of every accepted
format are refused while they stream and leave nothing; a refused token on a big upload is
answered (401/403 JSON), not reset; the embedded service builds an unbuilt model; tokens in
URLs only where a browser needs one (the coverage page, exchanged for a session cookie); every
error in the documented shape with no filesystem path of the server; OpenAPI declares the
bearer scheme; /metrics has a zero series per build state; /v1/workers is `farm workers --json`."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import re
import socket
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core.settings import Settings
from farm.pipeline.plan import build
from infra.devfarm.services import free_port
from registry.index import Registry
from registry.tokens import create_token
from tests.common.onnx_models import conv_relu_add, light
from tests.common.registry_state import snapshot
from tests.common.service import serve, token

WAIT = 15.0  # seconds each long poll of the flood would wait
FLOOD = 48  # long polls at once (more than the 45 of the flood first reported)


def auth(tok: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {tok}"}


# ---- in-process: the embedded service ----------------------------------------------------------------

@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("svc-home")
    settings = Settings.from_env({"FARM_HOME": str(home), "FARM_MAX_UPLOAD_MB": "1"})
    build(settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable")
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tokens = {scope: create_token(s, f"t-{scope}", scope) for scope in ("read", "submit", "admin")}
    reg.close()
    app = create_app(settings)
    with TestClient(app) as client:
        yield {"client": client, "settings": settings, "tokens": tokens, "app": app}


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar_bomb(size: int) -> bytes:
    """A plain tar: model.onnx, then one member of ``size`` zeros (its header declares them)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _member(tar, "model.onnx", b"\x08\x08")
        _member(tar, "weights.bin", b"\0" * size)
    return buf.getvalue()


def _zip_bomb(size: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.onnx", b"\x08\x08")
        zf.writestr("weights.bin", b"\0" * size)
    return buf.getvalue()


def _many_members(n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(n):
            _member(tar, f"d/{i}.bin", b"")
    return buf.getvalue()


_PLAIN = _tar_bomb(8 << 20)  # 8 MiB past a 1 MiB cap
BOMBS = {
    "tar": (_tar_bomb(2 << 20), "application/x-tar", 413, "too-large"),  # a plain tar is its own size
    "tar.gz": (gzip.compress(_PLAIN), "application/gzip", 400, "invalid-model"),
    "tar.bz2": (bz2.compress(_PLAIN), "application/x-bzip2", 400, "invalid-model"),
    "tar.xz": (lzma.compress(_PLAIN), "application/x-xz", 400, "invalid-model"),
    "tar.gz-as-x-tar": (gzip.compress(_PLAIN), "application/x-tar", 400, "invalid-model"),
    "tar.gz-members": (_many_members(5000), "application/gzip", 400, "invalid-model"),
    "zip": (_zip_bomb(8 << 20), "application/zip", 400, "invalid-model"),
    "gzip-as-onnx": (gzip.compress(b"\0" * (8 << 20)), "application/octet-stream", 400, "invalid-model"),
}


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_archive_bombs_of_every_format_are_refused_and_leave_nothing(svc: dict[str, Any], case: str) -> None:
    body, kind, status, code = BOMBS[case]
    assert len(body) < 1 << 20 or status == 413
    before = snapshot(svc["settings"])
    r = svc["client"].post("/v1/models", content=body, headers={**auth(svc["tokens"]["submit"]), "Content-Type": kind})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert snapshot(svc["settings"]) == before
    assert list((svc["settings"].home / "uploads").iterdir()) == []


def test_unpacking_stops_when_the_client_hangs_up(svc: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A real socket: the whole upload arrives, the client hangs up while it is unpacked; the
    unpacking is told (its ``cancelled`` is set) and nothing is kept."""
    import threading

    import uvicorn

    from farm.api import uploads

    reached, told = threading.Event(), threading.Event()
    real = uploads.unpack

    def watched(upload: Path, kind: str, dest: Path, *, max_bytes: int, cancelled: Any = None) -> Path:
        reached.set()
        if cancelled is not None and cancelled.wait(30):
            told.set()
        return real(upload, kind, dest, max_bytes=max_bytes, cancelled=cancelled)

    monkeypatch.setattr(uploads, "unpack", watched)
    port = free_port()
    # lifespan off: this second server must not shut the module's app (its runner) down when it stops
    server = uvicorn.Server(uvicorn.Config(svc["app"], host="127.0.0.1", port=port, log_level="error",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        assert _until(lambda: server.started, 10)
        before = snapshot(svc["settings"])
        body = gzip.compress(_tar_bomb(1000))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Type: application/gzip\r\n"
                         + f"Authorization: Bearer {svc['tokens']['submit']}\r\nContent-Length: {len(body)}\r\n\r\n"
                         .encode() + body)
            assert reached.wait(30)
        assert told.wait(30), "the unpacking never heard that the client left"
        assert _until(lambda: list((svc["settings"].home / "uploads").iterdir()) == [], 10)
        assert snapshot(svc["settings"]) == before
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_embedded_service_builds_an_unbuilt_model(svc: dict[str, Any], tmp_path: Path) -> None:
    """No FARM_BROKER_URL: POST /v1/releases builds in-process (was 500 bad-config)."""
    c, submit, read = svc["client"], svc["tokens"]["submit"], svc["tokens"]["read"]
    up = c.post("/v1/models?name=fresh", content=conv_relu_add(tmp_path / "f.onnx", seed=21).read_bytes(),
                headers=auth(submit))
    assert up.status_code == 200, up.text
    r = c.post("/v1/releases", json={"model": "fresh:latest", "targets": ["qnn:SM8650"]}, headers=auth(submit))
    assert r.status_code == 200, r.text
    release = r.json()
    deadline = time.monotonic() + 300
    while not release["done"] and time.monotonic() < deadline:
        release = c.get(f"/v1/releases/{release['release']}?wait=20", headers=auth(read)).json()
    assert release["done"] and release["ok"], release
    assert [b["state"] for b in release["builds"]] == ["succeeded"]


@pytest.mark.parametrize("ask", [{"sdks": ["2.47.0"]}, {"sdks": ["2.47.0"], "allow_queue": True},
                                 {"targets": ["trt:sm_89"]}])
def test_embedded_service_says_which_sdk_it_builds(svc: dict[str, Any], ask: dict[str, Any]) -> None:
    """An SDK the embedded service does not have: a 409 that says what it builds and
    where the others are built (was 503 no-worker, which clients read as "try again later");
    nothing is queued."""
    from sqlalchemy import text

    from farm.pipeline.accuracy import runtime_version

    c, submit, reg = svc["client"], svc["tokens"]["submit"], svc["app"].state.registry
    body = {"model": "sq:stable", "targets": ["qnn:SM8650"], **ask}
    with reg.db.session() as s:
        before = s.execute(text("SELECT count(*) FROM builds")).scalar()
    r = c.post("/v1/releases", json=body, headers=auth(submit))
    assert r.status_code == 409, r.text
    err = r.json()["error"]
    assert err["code"] == "no-worker" and "in-process" in err["message"], err
    assert f"QNN {runtime_version('qnn')}" in err["message"]
    assert "infra/farm-up.sh" in err["hint"] and "--allow-queue" in err["hint"]
    with reg.db.session() as s:
        assert s.execute(text("SELECT count(*) FROM builds")).scalar() == before


def test_tokens_in_urls_only_on_the_page_which_trades_them_for_a_cookie(svc: dict[str, Any]) -> None:
    c, read = svc["client"], svc["tokens"]["read"]
    for path in ("/v1/workers", "/v1/coverage", "/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0"):
        r = c.get(f"{path}{'&' if '?' in path else '?'}token={read}")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", (path, r.text)
        assert "coverage page" in r.json()["error"]["message"]
        # ... even beside a good header: the URL is what leaks
        assert c.get(f"{path}{'&' if '?' in path else '?'}token={read}", headers=auth(read)).status_code == 401
    c.cookies.clear()
    r = c.get(f"/coverage?soc=SM8650&token={read}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/coverage?soc=SM8650"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/coverage" in cookie
    # The filter form keeps working: the cookie, not the URL, carries the token.
    page = c.get("/coverage?soc=SM8650&sdk=2.51.0")
    assert page.status_code == 200 and "ctxfarm coverage" in page.text
    # The cookie opens nothing but the page.
    assert c.get("/v1/coverage").status_code == 401
    c.cookies.clear()
    assert c.get("/coverage").status_code == 401
    assert c.get("/coverage?token=cfk_unknown", follow_redirects=False).status_code == 401
    assert c.get("/coverage", headers=auth(read)).status_code == 200


def test_bearer_scheme_is_case_insensitive_and_other_schemes_are_refused(svc: dict[str, Any]) -> None:
    c, read = svc["client"], svc["tokens"]["read"]
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        assert c.get("/v1/workers", headers=auth(read, scheme)).status_code == 200, scheme
    r = c.get("/v1/workers", headers=auth(read, "Basic"))
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert "Bearer scheme" in r.json()["error"]["message"]


def _no_server_paths(text: str, settings: Settings) -> None:
    for root in {str(settings.home), tempfile.gettempdir(), os.getcwd(), str(Path.home())}:
        assert root not in text, (root, text)
    assert not re.search(r"(?<![\w:/])/(tmp|home|work|root|var|usr)/", text), text


def test_every_error_is_documented_json_with_no_server_path(svc: dict[str, Any], tmp_path: Path) -> None:
    c, submit, read = svc["client"], svc["tokens"]["submit"], svc["tokens"]["read"]
    broken = io.BytesIO()
    with tarfile.open(fileobj=broken, mode="w") as tar:
        _member(tar, "model.onnx", b"not a model at all")
    cases = [
        ("GET", "/no/such/route", {}, 404),
        ("DELETE", "/healthz", {}, 405),
        ("PATCH", "/v1/releases/1", {"headers": auth(read)}, 405),
        ("POST", "/v1/releases", {"content": b"{not json", "headers": {**auth(submit), "Content-Type": "application/json"}},
         400),
        ("POST", "/v1/releases", {"json": {"model": 3}, "headers": auth(submit)}, 400),
        ("GET", "/v1/releases/x", {"headers": auth(read)}, 400),
        ("GET", "/v1/releases/999999", {"headers": auth(read)}, 404),
        ("POST", "/v1/models", {"content": b"garbage", "headers": auth(submit)}, 400),
        ("POST", "/v1/models", {"content": broken.getvalue(), "headers": {**auth(submit),
                                                                        "Content-Type": "application/x-tar"}}, 400),
        ("POST", "/v1/models", {"content": gzip.compress(b"x" * 600)[:40],
                                "headers": {**auth(submit), "Content-Type": "application/gzip"}}, 400),
        ("GET", "/v1/blobs/sha256:" + "0" * 64, {"headers": auth(read)}, 404),
        ("GET", "/v1/blobs/../../etc/passwd", {"headers": auth(read)}, 404),
        ("GET", "/v1/resolve?model=nope:x&soc=SM8650&qnn=2.51.0", {"headers": auth(read)}, 404),
    ]
    for method, path, kw, status in cases:
        r = c.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.status_code, r.text)
        body = r.json()
        assert set(body) == {"error"} and {"code", "message", "hint"} <= set(body["error"]), (path, body)
        assert isinstance(body["error"]["code"], str) and body["error"]["message"], (path, body)
        _no_server_paths(r.text, svc["settings"])


def test_openapi_declares_the_bearer_scheme(svc: dict[str, Any]) -> None:
    doc = svc["client"].get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"]["securitySchemes"]["bearer"]["description"]}
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    for open_path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in ops[("get", open_path)]
    for key in (("get", "/v1/resolve"), ("post", "/v1/models"), ("post", "/v1/releases"), ("get", "/v1/workers"),
                ("put", "/v1/tags/{name}/{tag}")):
        assert {"bearer": []} in ops[key]["security"], key
    assert "token" not in {p["name"] for p in ops[("get", "/v1/resolve")].get("parameters", [])}
    # A bad parameter or body is 400 usage in the error shape: no route declares FastAPI's 422.
    assert not [key for key, op in ops.items() if "422" in op.get("responses", {})]
    assert ops[("get", "/v1/resolve")]["responses"]["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"}


def test_metrics_have_a_zero_series_for_every_build_state(tmp_path: Path) -> None:
    app = create_app(Settings.from_env({"FARM_HOME": str(tmp_path / "h")}))
    with TestClient(app) as c:
        text = c.get("/metrics").text
    for state in ("queued", "running", "succeeded", "failed"):
        assert re.search(rf'^ctxfarm_builds\{{state="{state}"\}} 0\.0$', text, re.M), (state, text)
    assert re.search(r"^ctxfarm_long_polls_waiting 0\.0$", text, re.M)


def test_workers_route_names_fields_as_farm_workers_json(svc: dict[str, Any], farm_env: dict[str, str]) -> None:
    from registry.index import register_worker
    from tests.common.cli import farm
    from workers.runner import Toolchain

    settings = svc["settings"]
    reg = Registry.open(settings)
    with reg.db.session() as s:
        register_worker(s, name="w-fields", host="h", pid=1, queues=["compile.qnn.2.51.0"],
                        toolchain=Toolchain("qnn", "2.51.0", "1.22", "onnxruntime-qnn", "1.22"))
    reg.close()
    api = svc["client"].get("/v1/workers", headers=auth(svc["tokens"]["read"])).json()
    cli = json.loads(farm({**farm_env, "FARM_HOME": str(settings.home)}, "workers", "--json").stdout)
    assert api and cli and set(api[0]) == set(cli[0]), (sorted(api[0]), sorted(cli[0]))


# ---- a real `farm serve` (uvicorn in a subprocess) ------------------------------------------------

@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict[str, Any]]:
    """`farm serve` with a broker and no worker: a release queued there stays queued, so a long
    poll on it waits its whole ``wait``."""
    home = tmp_path_factory.mktemp("live-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update({"FARM_HOME": str(home), "FARM_BROKER_URL": redis_server, "FARM_MAX_UPLOAD_MB": "64"})
    settings = Settings.from_env(env)
    build(Settings.from_env({"FARM_HOME": str(home)}), light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable")
    tokens = {name: token(settings, name, scope) for name, scope in
              (("r1", "read"), ("r2", "read"), ("sub", "submit"))}
    port = free_port()
    log = home / "serve.log"
    proc = serve(env, port, log)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "tokens": tokens, "settings": settings, "log": log}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(url: str, tok: str | None = None, timeout: float = 60) -> tuple[int, Any, float]:
    started = time.perf_counter()
    req = urllib.request.Request(url, headers=auth(tok) if tok else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, json.loads(body) if body[:1] in (b"{", b"[") else body, time.perf_counter() - started


def _waiting(live: dict[str, Any]) -> float:
    _, text, _ = _get(live["url"] + "/metrics")
    m = re.search(rb"^ctxfarm_long_polls_waiting (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def _long_poll(live: dict[str, Any], release: int, tok: str) -> socket.socket:
    """A long poll on a raw socket, left waiting (closed by the test: the client hangs up)."""
    sock = socket.create_connection(("127.0.0.1", live["port"]), timeout=10)
    sock.sendall(f"GET /v1/releases/{release}?wait={WAIT} HTTP/1.1\r\nHost: x\r\n"
                 f"Authorization: Bearer {tok}\r\n\r\n".encode())
    return sock


def _until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_long_poll_flood_never_delays_probes_or_resolve(live: dict[str, Any]) -> None:
    url, tokens = live["url"], live["tokens"]
    req = urllib.request.Request(url + "/v1/releases", method="POST", headers={
        **auth(tokens["sub"]), "Content-Type": "application/json"}, data=json.dumps({
            "model": "sq:stable", "targets": ["qnn:SM8750"], "sdks": ["2.51.0"], "allow_queue": True}).encode())
    with urllib.request.urlopen(req, timeout=30) as resp:
        release = json.loads(resp.read())
    assert not release["done"] and release["builds"][0]["state"] == "queued"

    socks = [_long_poll(live, release["release"], tokens["r1" if i % 2 else "r2"]) for i in range(FLOOD)]
    try:
        assert _until(lambda: _waiting(live) == FLOOD, WAIT / 3), _waiting(live)
        timings = {}
        for path, tok in (("/healthz", None), ("/readyz", None),
                          ("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", tokens["r1"]),
                          (f"/v1/releases/{release['release']}", tokens["r2"])):
            status, _, seconds = _get(url + path, tok, timeout=WAIT * 2)
            assert status == 200, path
            timings[path.split("?")[0]] = seconds
        # A sanity bound far below the wait (the figures go to the report, not into an assert):
        # before the fix every probe waited behind the long polls for about WAIT seconds.
        print("while", FLOOD, "long polls waited:", {k: f"{v * 1000:.1f} ms" for k, v in timings.items()})
        assert max(timings.values()) < WAIT / 5, timings
        assert _waiting(live) == FLOOD

        # Past the per-token cap: 429 rate-limited at once, with Retry-After.
        from farm.api.longpoll import MAX_WAITERS_PER_TOKEN

        extra = [_long_poll(live, release["release"], tokens["r1"]) for _ in range(MAX_WAITERS_PER_TOKEN - FLOOD // 2)]
        socks += extra
        assert _until(lambda: _waiting(live) == FLOOD + len(extra), WAIT / 3)
        status, body, seconds = _get(f"{url}/v1/releases/{release['release']}?wait={WAIT}", tokens["r1"])
        assert status == 429 and body["error"]["code"] == "rate-limited" and seconds < WAIT / 5, body
    finally:
        for s in socks:
            s.close()
    # Clients that hang up free their slots at once, not when their wait ends.
    assert _until(lambda: _waiting(live) == 0, WAIT / 3), _waiting(live)
    assert "Traceback" not in live["log"].read_text()


def test_a_refused_token_on_a_big_upload_is_answered_not_reset(live: dict[str, Any], tmp_path: Path) -> None:
    """A read or unknown token on a 4 MB+ model is 403/401 JSON the client
    shows, not `Connection reset by peer` (the token is checked before the body is read)."""
    from farm.client import Client
    from farm.core.errors import ForbiddenError, UnauthorizedError

    model = tmp_path / "big.onnx"
    model.write_bytes(os.urandom(6 << 20))
    before = snapshot(live["settings"])
    for tok, error in ((live["tokens"]["r1"], ForbiddenError), ("cfk_not_a_token", UnauthorizedError)):
        with pytest.raises(error):
            Client(live["url"], tok).upload(model, name="big")
    assert snapshot(live["settings"]) == before


def _answer_to_headers_only(live: dict[str, Any], headers: str) -> bytes:
    """Send only the head of an upload that asks ``Expect: 100-continue``; what comes back."""
    with socket.create_connection(("127.0.0.1", live["port"]), timeout=10) as sock:
        sock.sendall(headers.encode())
        data = b""
        while True:
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            if sep and length and len(body) >= int(length.group(1)):
                return data
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk


@pytest.mark.parametrize("who,size,status", [("r1", 6 << 20, 403), ("nobody", 6 << 20, 401), ("sub", 65 << 20, 413)])
def test_an_upload_that_expects_100_continue_is_refused_before_its_body(live: dict[str, Any], who: str, size: int,
                                                                        status: int) -> None:
    """curl's way: the client waits for the service's word before it sends a large body; a
    refusal (the token, or the declared size over FARM_MAX_UPLOAD_MB) is that word."""
    tok = live["tokens"].get(who, "cfk_nobody")
    answer = _answer_to_headers_only(live, f"POST /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {tok}\r\n"
                                           f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n"
                                           "Expect: 100-continue\r\n\r\n")
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b'"error"' in answer


def test_blob_conditional_gets_compare_weakly_and_star_needs_the_blob(svc: dict[str, Any]) -> None:
    c, read = svc["client"], svc["tokens"]["read"]
    res = c.get("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", headers=auth(read)).json()
    digest = res["files"][0]["digest"]
    url = f"/v1/blobs/{digest}"
    for header, status in ((f'"{digest}"', 304), (f'W/"{digest}"', 304), (f'"x", W/"{digest}"', 304), ("*", 304),
                           ('"sha256:other"', 200)):
        r = c.get(url, headers={**auth(read), "If-None-Match": header})
        assert r.status_code == status, (header, r.status_code)
        assert r.headers["etag"] == f'"{digest}"'
    missing = c.get("/v1/blobs/sha256:" + "1" * 64, headers={**auth(read), "If-None-Match": "*"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "blob-not-found"
