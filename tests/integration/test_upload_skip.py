"""Hash first (issue 22): `farm submit --server` offers a bundle's digest before it sends any
of it, and an unchanged model is not uploaded again. The real service (create_app under uvicorn,
in a thread) with a counting middleware in front: what reached the upload route, in bytes."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.cli.cluster_cmd import send_model
from farm.client import Client
from farm.core.settings import Settings
from tests.common.onnx_models import matmul_add, save_external
from tests.common.service import token


class Counting:
    """ASGI middleware: requests and body bytes per (method, path)."""

    def __init__(self, app: Any):
        self.app = app
        self.hits: dict[tuple[str, str], int] = {}
        self.bytes: dict[tuple[str, str], int] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        key = (scope["method"], "/v1/models/DIGEST" if path.startswith("/v1/models/sha256:") else path)
        self.hits[key] = self.hits.get(key, 0) + 1

        async def counted() -> Any:
            msg = await receive()
            if msg["type"] == "http.request":
                self.bytes[key] = self.bytes.get(key, 0) + len(msg.get("body", b""))
            return msg

        return await self.app(scope, counted, send)


@pytest.fixture
def service(settings: Settings) -> Iterator[dict[str, Any]]:
    import uvicorn

    from farm.api.app import create_app

    counting = Counting(create_app(settings))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(counting, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield {"url": f"http://127.0.0.1:{port}", "counting": counting,
               "token": token(settings, "ci", "submit")}
    finally:
        server.should_exit = True
        t.join(10)


def args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"name": "llm/m", "tag": "stable", "force_tag": False, "json": True, **kw})


def test_an_unchanged_model_is_not_sent_again(service: dict[str, Any], settings: Settings, tmp_path: Path) -> None:
    model = save_external(matmul_add(seed=11, size=256), tmp_path / "m" / "model.onnx")  # 256 KiB of weights
    client = Client(service["url"], service["token"])
    counting: Counting = service["counting"]

    first = send_model(client, model, args(), settings)
    upload = ("POST", "/v1/models")
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
