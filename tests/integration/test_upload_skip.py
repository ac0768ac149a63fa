"""Hash first (issue 22): `farm submit --server` offers a bundle's digest before it sends any
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
