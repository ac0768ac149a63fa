"""Hash first: `farm submit --server` offers a bundle's digest before it sends any
of it, and an unchanged model is not uploaded again. The real service in this process with a
counting middleware in front (tests.common.inproc): what reached the upload route, in bytes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.cli.cluster_cmd import send_model
from farm.client import Client
from farm.core.errors import NotFoundError, UnauthorizedError, UsageError
from farm.core.settings import Settings
from tests.common.inproc import Counting, running_service
from tests.common.onnx_models import matmul_add, save_external


@pytest.fixture
def service(settings: Settings) -> Iterator[dict[str, Any]]:
    with running_service(settings) as svc:
        yield svc


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"name": "llm/m", "tag": "stable", "force_tag": False, "json": True, **kw})


def test_an_unchanged_model_is_not_sent_again(service: dict[str, Any], settings: Settings, tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=11, size=256), tmp_path / "m" / "model.onnx")  # 256 KiB of weights
    client = Client(service["url"], service["token"])
    counting: Counting = service["counting"]

    first = send_model(client, model, args(), settings)
    upload = ("PATCH", "/v1/uploads/ID")  # farm submit uploads through a resumable session
    assert counting.hits.get(upload) == 1
    assert counting.bytes[upload] > 256 * 1024  # the bundle went as a tar: .onnx + w.data
    assert len(first["files"]) == 2 and first["tag"] == "llm/m:stable"

    again = send_model(client, model, args(), settings)
    assert again["digest"] == first["digest"] and again["tag"] == "llm/m:stable"
    assert counting.hits.get(upload) == 1  # the upload route was not hit again
    held = ("POST", "/v1/models/DIGEST")
    assert counting.hits[held] == 2  # asked both times; answered 404 then 200
    assert counting.bytes.get(held, 0) == 0  # no model bytes: the question has no body

    # A changed data file is noticed (its stat changed) and the new bundle is uploaded.
    data = model.parent / "w.data"
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    changed = send_model(client, model, args(force_tag=True), settings)
    assert changed["digest"] != first["digest"] and counting.hits[upload] == 2


def test_a_lone_model_the_client_did_not_inspect_is_refused_by_the_service(
        service: dict[str, Any], settings: Settings, tmp_path: Path) -> None:
    """A small .onnx that names no external data is not inspected by the client (no onnx import
    per submit); the service inspects what it is sent: an invalid one is invalid-model there,
    and nothing is recorded."""
    from farm.core.errors import InvalidModelError
    from registry.index import Registry
    from registry.models import Model

    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07 not a model at all")
    client = Client(service["url"], service["token"])
    with pytest.raises(InvalidModelError):
        send_model(client, junk, args(), settings)
    reg = Registry.open(settings)
    try:
        with reg.db.session() as s:
            assert s.query(Model).count() == 0
    finally:
        reg.close()


def test_held_answers_404_then_200_and_checks_the_digest(service: dict[str, Any], settings: Settings,
                                                         tmp_path: Path) -> None:
    from farm.core.digests import local_bundle
    from farm.core.errors import UsageError

    model = save_external(matmul_add(seed=12, size=64), tmp_path / "m" / "model.onnx")
    client = Client(service["url"], service["token"])
    b = local_bundle(model, None)
    assert client.held(b.digest) is None
    assert client.upload_bundle(b.members)["digest"] == b.digest  # the streamed tar hashes as the local bundle
    got = client.held(b.digest)
    assert got is not None and got["size"] == b.size
    assert client.json("GET", f"/v1/models/{b.digest}")["digest"] == b.digest
    with pytest.raises(UsageError):
        client.json("GET", "/v1/models/sha256:not-a-digest")


def test_an_upload_cut_short_goes_on_from_where_it_stopped(service: dict[str, Any], settings: Settings,
                                                         tmp_path: Path) -> None:
    """A session that took the first part of the bundle (the connection then dropped) is asked
    where it stands and only the rest is sent; the model is the local bundle."""
    import json

    from farm.client import _Stream, _tar_parts
    from farm.core.digests import local_bundle

    model = save_external(matmul_add(seed=13, size=256), tmp_path / "m" / "model.onnx")
    client = Client(service["url"], service["token"])
    counting: Counting = service["counting"]
    bundle = local_bundle(model, None)
    parts, total = _tar_parts(bundle.members)
    session = client.json("POST", "/v1/uploads")["upload"]
    head = b"".join(_Stream(parts))[: total // 3]  # what got through before the cut
    with client._request("PATCH", f"/v1/uploads/{session}", body=head,
                         headers={"Upload-Offset": "0", "Content-Type": "application/octet-stream"}):
        pass
    assert client.json("GET", f"/v1/uploads/{session}")["offset"] == len(head)
    # farm submit remembers the session of this bundle: the next run goes on with it.
    (settings.home / "cache").mkdir(parents=True, exist_ok=True)
    (settings.home / "cache" / "uploads.json").write_text(json.dumps({bundle.digest: session}))
    before = counting.bytes[("PATCH", "/v1/uploads/ID")]
    got = send_model(client, model, args(), settings)
    assert got["digest"] == bundle.digest and got["tag"] == "llm/m:stable"
    assert counting.bytes[("PATCH", "/v1/uploads/ID")] - before == total - len(head)  # only the rest
    assert counting.hits[("POST", "/v1/uploads")] == 1  # no new session
    assert json.loads((settings.home / "cache" / "uploads.json").read_text()) == {}
    with pytest.raises(NotFoundError):  # completed: the session is gone
        client.json("GET", f"/v1/uploads/{session}")


def test_upload_sessions_refuse_what_is_not_theirs(service: dict[str, Any]) -> None:
    client = Client(service["url"], service["token"])
    for bad in ("..%2F..%2Fetc", "0" * 31, "G" * 32, "0" * 32):
        with pytest.raises((NotFoundError, UsageError)):
            client.json("GET", f"/v1/uploads/{bad}")
    session = client.json("POST", "/v1/uploads")["upload"]
    with pytest.raises(UsageError, match="holds 0 bytes"):  # a piece at another offset
        with client._request("PATCH", f"/v1/uploads/{session}", body=b"x" * 10,
                             headers={"Upload-Offset": "5", "Content-Type": "application/octet-stream"}):
            pass
    reader = Client(service["url"], None)
    with pytest.raises(UnauthorizedError):
        reader.json("POST", "/v1/uploads")


def test_one_writer_per_session_and_a_bounded_number_of_sessions(service: dict[str, Any], settings: Settings,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    from farm.api.routes import upload_sessions
    from farm.core.errors import RateLimitedError

    client = Client(service["url"], service["token"])
    session = client.json("POST", "/v1/uploads")["upload"]
    d = settings.home / "uploads" / f"session-{session}"
    with open(d / "lock", "a") as held:  # another request is writing this session
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(UsageError, match="another request"):
            with client._request("PATCH", f"/v1/uploads/{session}", body=b"x" * 10,
                                 headers={"Upload-Offset": "0", "Content-Type": "application/octet-stream"}):
                pass
    assert client.json("GET", f"/v1/uploads/{session}")["offset"] == 0  # nothing of the refused piece
    monkeypatch.setattr(upload_sessions, "MAX_SESSIONS", 3)
    client.json("POST", "/v1/uploads")
    client.json("POST", "/v1/uploads")
    with pytest.raises(RateLimitedError):
        client.json("POST", "/v1/uploads")


def test_a_service_without_upload_sessions_gets_one_upload(service: dict[str, Any], settings: Settings,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from farm.core.errors import NotFoundError

    model = save_external(matmul_add(seed=14, size=32), tmp_path / "m" / "model.onnx")
    client = Client(service["url"], service["token"])
    real = client.json

    def older(method: str, path: str, *a: Any, **kw: Any) -> Any:
        if path == "/v1/uploads":
            raise NotFoundError("no route")  # what a service before upload sessions answers
        return real(method, path, *a, **kw)

    monkeypatch.setattr(client, "json", older)
    got = send_model(client, model, args(), settings)
    assert len(got["files"]) == 2 and service["counting"].hits[("POST", "/v1/models")] == 1


def test_a_small_lone_model_goes_in_one_request(service: dict[str, Any], settings: Settings, tmp_path: Path) -> None:
    """No upload session for a lone .onnx of a few KiB: POST /v1/models, one request; held the
    next time as any other."""
    from tests.common.onnx_models import matmul_add, save

    model = save(matmul_add(seed=21), tmp_path / "small.onnx")
    client = Client(service["url"], service["token"])
    counting: Counting = service["counting"]
    first = send_model(client, model, args(), settings)
    assert counting.hits.get(("POST", "/v1/models")) == 1
    assert not counting.hits.get(("POST", "/v1/uploads")) and not counting.hits.get(("PATCH", "/v1/uploads/ID"))
    again = send_model(client, model, args(), settings)
    assert again["digest"] == first["digest"] and counting.hits.get(("POST", "/v1/models")) == 1
