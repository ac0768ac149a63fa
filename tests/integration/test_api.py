"""The HTTP service in-process (FastAPI TestClient) on the embedded registry, with a real QNN
compile behind it: the auth matrix, hostile uploads, blobs (Range, ETag), tags, coverage, metrics,
the device client's resume, and schemathesis against the OpenAPI schema."""

from __future__ import annotations

import io
import socket
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.core.settings import Settings
from farm.pipeline.plan import build
from registry.index import Registry
from registry.tokens import create_token
from tests.common.onnx_models import conv_relu_add, light
from tests.common.registry_state import snapshot


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("api-home")
    settings = Settings.from_env({"FARM_HOME": str(home), "FARM_MAX_UPLOAD_MB": "1"})
    (o,) = build(settings, light("squeezenet"), ["qnn:SM8650"], name="sq", tag="stable").outcomes
    reg = Registry.open(settings)
    with reg.db.session() as s:
        tokens = {scope: create_token(s, f"t-{scope}", scope) for scope in ("read", "submit", "admin")}
        revoked = create_token(s, "t-revoked", "admin")
    from registry.tokens import revoke_token

    with reg.db.session() as s:
        revoke_token(s, "t-revoked")
    reg.close()
    app = create_app(settings)
    with TestClient(app) as client:
        yield {"client": client, "settings": settings, "tokens": tokens, "revoked": revoked, "artifact": o.artifact,
               "build": o.build_id, "app": app}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def small_onnx(tmp: Path, seed: int = 3) -> bytes:
    return conv_relu_add(tmp / f"s{seed}.onnx", seed=seed).read_bytes()


def endpoints(svc: dict[str, Any], tmp: Path) -> list[tuple[str, str, str, dict[str, Any]]]:
    art = svc["artifact"]
    return [
        ("GET", "/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", "read", {}),
        ("GET", f"/v1/blobs/{art}", "read", {}),
        ("GET", f"/v1/builds/{svc['build']}", "read", {}),
        ("GET", "/v1/releases/1", "read", {}),
        ("GET", "/v1/coverage", "read", {}),
        ("GET", "/coverage", "read", {}),
        ("GET", "/v1/workers", "read", {}),
        ("POST", "/v1/models", "submit", {"content": small_onnx(tmp),
                                          "headers": {"Content-Type": "application/octet-stream"}}),
        ("POST", "/v1/releases", "submit", {"json": {"model": "sq:stable", "targets": ["qnn:SM8650"]}}),
        ("GET", "/v1/tags/sq/stable", "admin", {}),
        ("PUT", "/v1/tags/sq/stable", "admin", {"json": {"digest": "sq:stable"}}),
        ("DELETE", "/v1/tags/vision/gone/x", "admin", {}),
    ]


def test_auth_matrix(service: dict[str, Any], tmp_path: Path) -> None:
    c, tokens = service["client"], service["tokens"]
    weaker = {"read": [], "submit": ["read"], "admin": ["read", "submit"]}
    rows = []
    for method, path, needed, kw in endpoints(service, tmp_path):
        headers = kw.pop("headers", {})
        for label, token, want in ([("none", None, {401}), ("unknown", "cfk_nope", {401}),
                                    ("revoked", service["revoked"], {401})]
                                   + [(f"{w}-scope", tokens[w], {403}) for w in weaker[needed]]):
            r = c.request(method, path, headers={**headers, **(auth(token) if token else {})}, **kw)
            assert r.status_code in want, (method, path, label, r.status_code, r.text)
            assert r.json()["error"]["code"] in ("unauthorized", "forbidden")
            rows.append((method, path, label, r.status_code))
        r = c.request(method, path, headers={**headers, **auth(tokens[needed])}, **kw)
        assert r.status_code not in (401, 403, 500), (method, path, r.status_code, r.text)
        rows.append((method, path, needed, r.status_code))
    assert len(rows) >= 12 * 4
    # /healthz, /readyz and /metrics are open.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert c.get(path).status_code == 200


def test_a_read_token_can_never_submit_tag_or_delete(service: dict[str, Any], tmp_path: Path) -> None:
    c, read = service["client"], service["tokens"]["read"]
    before = snapshot(service["settings"])
    assert c.post("/v1/models", content=small_onnx(tmp_path, 9), headers=auth(read)).status_code == 403
    assert c.post("/v1/releases", json={"model": "sq", "targets": ["qnn:SM8650"]}, headers=auth(read)).status_code == 403
    assert c.put("/v1/tags/sq/evil", json={"digest": "sq"}, headers=auth(read)).status_code == 403
    assert c.delete("/v1/tags/sq/stable", headers=auth(read)).status_code == 403
    assert snapshot(service["settings"]) == before


def _tar(members: list[tuple[str, bytes | None, str | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data or b"")
                tar.addfile(info, io.BytesIO(data or b""))
    return buf.getvalue()


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.onnx", b"\x08\x08" + b"\x00" * 50)
        zf.writestr("weights.bin", b"\x00" * (8 * 1024 * 1024))  # 8 MiB from a few KiB, cap is 1 MiB
    return buf.getvalue()


HOSTILE = {
    "not-onnx": (b"hello, not a model", "application/octet-stream", 400, "invalid-model"),
    "truncated": (None, "application/octet-stream", 400, "invalid-model"),
    "tar-dotdot": (_tar([("model.onnx", b"x", None), ("../evil.bin", b"x", None)]), "application/x-tar", 400,
                   "invalid-model"),
    "tar-absolute": (_tar([("model.onnx", b"x", None), ("/tmp/evil.bin", b"x", None)]), "application/x-tar", 400,
                     "invalid-model"),
    "tar-symlink": (_tar([("model.onnx", b"x", None), ("w.bin", None, "/etc/passwd")]), "application/x-tar", 400,
                    "invalid-model"),
    "tar-backslash": (_tar([("model.onnx", b"x", None), ("a\\b.bin", b"x", None)]), "application/x-tar", 400,
                      "invalid-model"),
    "tar-garbage": (b"\x00" * 1024, "application/x-tar", 400, "invalid-model"),
    "zip-bomb": (_zip_bomb(), "application/zip", 400, "invalid-model"),
    "too-large": (b"\x08" * (1024 * 1024 + 10), "application/octet-stream", 413, "too-large"),
    "unknown-type": (b"x", "text/plain", 400, "invalid-model"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_uploads(service: dict[str, Any], case: str) -> None:
    c, submit = service["client"], service["tokens"]["submit"]
    body, kind, status, code = HOSTILE[case]
    if body is None:
        body = light("resnet50").read_bytes()[:20_000]
    before = snapshot(service["settings"])
    r = c.post("/v1/models", content=body, headers={**auth(submit), "Content-Type": kind})
    assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert snapshot(service["settings"]) == before
    assert list((service["settings"].home / "uploads").iterdir()) == []


def test_same_content_twice_is_the_same_digest(service: dict[str, Any], tmp_path: Path) -> None:
    c, submit = service["client"], service["tokens"]["submit"]
    data = small_onnx(tmp_path, 4)
    a = c.post("/v1/models?name=twice", content=data, headers=auth(submit)).json()
    before = snapshot(service["settings"])
    b = c.post("/v1/models?name=twice", content=data, headers=auth(submit)).json()
    assert a["digest"] == b["digest"] and a["tag"] == "twice:latest"
    assert snapshot(service["settings"]) == before


def test_archive_with_external_data_has_the_local_digest(service: dict[str, Any], tmp_path: Path) -> None:
    from farm.core.bundle import inspect_model

    model = conv_relu_add(tmp_path / "ext.onnx", external=True, seed=5)
    archive = _tar([("ext.onnx", model.read_bytes(), None), ("ext.data", (tmp_path / "ext.data").read_bytes(), None)])
    r = service["client"].post("/v1/models", content=archive,
                               headers={**auth(service["tokens"]["submit"]), "Content-Type": "application/x-tar"})
    assert r.status_code == 200, r.text
    assert r.json()["digest"] == inspect_model(model).digest


def test_interrupted_upload_leaves_nothing(service: dict[str, Any]) -> None:
    """A real socket: headers promise 100 kB, 10 bytes arrive, the client hangs up."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(service["app"], host="127.0.0.1", port=port, log_level="error"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        before = snapshot(service["settings"])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
                         b"Authorization: Bearer " + service["tokens"]["submit"].encode() +
                         b"\r\nContent-Length: 100000\r\n\r\n0123456789")
        time.sleep(1.0)
        assert snapshot(service["settings"]) == before
        assert list((service["settings"].home / "uploads").iterdir()) == []
    finally:
        server.should_exit = True
        t.join(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_blobs_range_etag_and_if_none_match(service: dict[str, Any]) -> None:
    c, read = service["client"], service["tokens"]["read"]
    res = c.get("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", headers=auth(read)).json()
    f = next(x for x in res["files"] if x["name"].endswith(".bin"))
    whole = c.get(f"/v1/blobs/{f['digest']}", headers=auth(read))
    assert whole.status_code == 200 and len(whole.content) == f["size"] and whole.headers["etag"] == f'"{f["digest"]}"'
    part = c.get(f"/v1/blobs/{f['digest']}", headers={**auth(read), "Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == whole.content[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{f['size']}"
    tail = c.get(f"/v1/blobs/{f['digest']}", headers={**auth(read), "Range": "bytes=-5"})
    assert tail.content == whole.content[-5:]
    same = c.get(f"/v1/blobs/{f['digest']}", headers={**auth(read), "If-None-Match": f'"{f["digest"]}"'})
    assert same.status_code == 304
    bad = c.get(f"/v1/blobs/{f['digest']}", headers={**auth(read), "Range": f"bytes={f['size'] + 5}-"})
    assert bad.status_code == 416
    assert c.get("/v1/blobs/not-a-digest", headers=auth(read)).status_code == 400
    assert c.get("/v1/blobs/sha256:" + "0" * 64, headers=auth(read)).status_code == 404


def test_resolve_miss_is_404_with_the_cli_explanation(service: dict[str, Any]) -> None:
    r = service["client"].get("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.47.0",
                              headers=auth(service["tokens"]["read"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "no-match"
    assert "QNN <= 2.47.0" in r.json()["error"]["hint"]
    bad = service["client"].get("/v1/resolve?model=../esc&soc=SM8650&qnn=2.51.0",
                                headers=auth(service["tokens"]["read"]))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad-name"


def test_tags_with_history(service: dict[str, Any], tmp_path: Path) -> None:
    c, admin = service["client"], service["tokens"]["admin"]
    other = c.post("/v1/models", content=small_onnx(tmp_path, 7), headers=auth(admin)).json()["digest"]
    put = c.put("/v1/tags/team/net/beta", json={"digest": other}, headers=auth(admin)).json()
    assert put["name"] == "team/net" and put["digest"] == other
    assert c.delete("/v1/tags/team/net/beta", headers=auth(admin)).status_code == 200
    gone = c.get("/v1/tags/team/net/beta", headers=auth(admin)).json()
    assert gone["digest"] is None and [e["action"] for e in gone["history"]] == ["created", "deleted"]


def test_tag_moves_need_force(service: dict[str, Any], tmp_path: Path) -> None:
    c, admin = service["client"], service["tokens"]["admin"]
    one = c.post("/v1/models?name=team/mover&tag=rc", content=small_onnx(tmp_path, 11),
                 headers=auth(admin)).json()["digest"]
    two = c.post("/v1/models", content=small_onnx(tmp_path, 12), headers=auth(admin)).json()["digest"]
    # An upload naming a tag that points at another model: 409, the tag stays.
    refused = c.post("/v1/models?name=team/mover&tag=rc", content=small_onnx(tmp_path, 12), headers=auth(admin))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "tag-conflict"
    assert c.get("/v1/tags/team/mover/rc", headers=auth(admin)).json()["digest"] == one
    forced = c.post("/v1/models?name=team/mover&tag=rc&force_tag=true", content=small_onnx(tmp_path, 12),
                    headers=auth(admin)).json()
    assert forced["tag_moved"] == {"tag": "team/mover:rc", "from": one, "to": two}
    # PUT: the same registry call as `farm tag`.
    no = c.put("/v1/tags/team/mover/rc", json={"digest": one}, headers=auth(admin))
    assert no.status_code == 409 and no.json()["error"]["code"] == "tag-conflict"
    yes = c.put("/v1/tags/team/mover/rc", json={"digest": one, "force": True}, headers=auth(admin)).json()
    assert yes["digest"] == one and yes["tag_moved"] == {"tag": "team/mover:rc", "from": two, "to": one}
    assert [e["action"] for e in yes["history"]] == ["created", "moved", "moved"]
    by_artifact = c.put("/v1/tags/team/mover/art", json={"digest": service["artifact"][7:19]},
                        headers=auth(admin)).json()
    assert by_artifact["digest"] == c.get("/v1/tags/sq/stable", headers=auth(admin)).json()["digest"]


def test_metrics_and_readiness(service: dict[str, Any]) -> None:
    c = service["client"]
    c.get("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", headers=auth(service["tokens"]["read"]))
    text = c.get("/metrics").text
    assert 'ctxfarm_builds{state="succeeded"}' in text
    assert "ctxfarm_resolve_seconds_count" in text and "ctxfarm_compile_seconds_bucket" in text
    assert "ctxfarm_blob_bytes_served_total" in text
    ready = c.get("/readyz").json()
    assert ready == {"ready": True, "checks": {"database": True, "store": True}}


def test_device_client_resumes_and_places_atomically(service: dict[str, Any], tmp_path: Path) -> None:
    """farm.client.install through a real socket, with half of a file already downloaded."""
    import uvicorn

    from farm.client import install

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(service["app"], host="127.0.0.1", port=port, log_level="error"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        while not server.started:
            time.sleep(0.05)
        url, read = f"http://127.0.0.1:{port}", service["tokens"]["read"]
        res = service["client"].get("/v1/resolve?model=sq:stable&soc=SM8650&qnn=2.51.0", headers=auth(read)).json()
        f = next(x for x in res["files"] if x["name"].endswith(".bin"))
        whole = service["client"].get(f"/v1/blobs/{f['digest']}", headers=auth(read)).content
        dest = tmp_path / "device" / "sq"
        partial = dest.parent / ".sq.ctxfarm-partial"
        partial.mkdir(parents=True)
        (partial / f["digest"].removeprefix("sha256:")).write_bytes(whole[: len(whole) // 2])
        got = install(url, read, "sq:stable", soc="SM8650", qnn="2.51.0", dest=dest)
        assert got.resumed_bytes == len(whole) // 2
        assert got.ctx_model == dest / "model_ctx.onnx" and (dest / f["name"]).read_bytes() == whole
        assert not partial.exists()
        with pytest.raises(Exception) as exc:
            install(url, "cfk_wrong", "sq:stable", soc="SM8650", qnn="2.51.0", dest=tmp_path / "x")
        assert getattr(exc.value, "code", "") == "unauthorized"
    finally:
        server.should_exit = True
        t.join(10)


def test_a_blob_stored_compressed_is_served_decoded_or_redirected_to_who_takes_zstd(
        s3_url: str, tmp_path: Path) -> None:
    """With an S3 store: a blob held as is goes 307 to S3; one held zstd-compressed is streamed
    decoded (whole or a Range) unless the client takes zstd, whole."""
    import urllib.request

    import zstandard

    from farm.core.keys import sha256_bytes
    from registry.store.base import put_bytes

    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_STORE_URL": s3_url})
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            read = create_token(s, "t-read", "read")
        packed = b"".join(bytes([i % 7]) * 4000 + bytes(range(96)) for i in range(300))
        plain = bytes(range(256)) * 5
        assert put_bytes(reg.store, packed).encoding == "zstd" and put_bytes(reg.store, plain).encoding is None
    finally:
        reg.close()
    with TestClient(create_app(settings)) as c:
        def get(digest: str, **headers: str) -> Any:
            return c.get(f"/v1/blobs/{digest}", headers={**auth(read), **headers}, follow_redirects=False)

        d = sha256_bytes(packed)
        whole = get(d, **{"Accept-Encoding": "gzip, deflate"})
        assert whole.status_code == 200 and whole.content == packed and "content-encoding" not in whole.headers
        part = get(d, Range="bytes=4000-4099")
        assert part.status_code == 206 and part.content == packed[4000:4100]
        assert part.headers["content-range"] == f"bytes 4000-4099/{len(packed)}"
        for takes in ("zstd", "gzip, zstd;q=0.5", "br, *"):
            moved = get(d, **{"Accept-Encoding": takes})
            assert moved.status_code == 307, takes
            with urllib.request.urlopen(moved.headers["location"], timeout=10) as r:
                assert r.headers["Content-Encoding"] == "zstd"
                assert zstandard.ZstdDecompressor().decompress(r.read()) == packed
        for refuses in ("zstd;q=0", "gzip", "zstd;q=nope"):
            assert get(d, **{"Accept-Encoding": refuses}).status_code == 200, refuses
        assert get(d, **{"Accept-Encoding": "zstd"}, Range="bytes=0-9").content == packed[:10]
        assert get(sha256_bytes(plain)).status_code == 307
