"""No path of the server's filesystem in an error a client reads (farm.api.errors.redact), and
nothing else touched: URLs, routes, model names and digests stay as they were."""

from __future__ import annotations

import pytest

from farm.api.errors import REDACTED, error_response, redact, server_roots
from farm.core.errors import InvalidModelError, StorageError
from farm.core.settings import Settings

SETTINGS = Settings.from_env({"FARM_HOME": "/srv/farm-x", "FARM_STORE_URL": "file:///blobstore/b",
                              "FARM_DATABASE_URL": "sqlite:////indexes/one.db"})
ROOTS = server_roots(SETTINGS)


@pytest.mark.parametrize("text", [
    "cannot open /srv/farm-x/uploads/upload-1/bundle/model.onnx: not an ONNX file",
    "blob store error (/blobstore/b/sha256/ab/cd) missing",
    "index database error (sqlite:////indexes/one.db): locked",
    "no such file: '/tmp/pytest-of-root/x/y.onnx'",
    "[Errno 13] Permission denied: /home/u/.cache/x",
])
def test_paths_of_the_host_are_hidden(text: str) -> None:
    out = redact(text, ROOTS)
    assert out is not None and REDACTED in out
    for root in ("/srv/farm-x", "/blobstore", "/indexes", "/tmp/", "/home/"):
        assert root not in out, out


@pytest.mark.parametrize("text", [
    "no route GET /v1/nope",
    "see http://127.0.0.1:8080/v1/blobs/sha256:" + "a" * 64,
    "no model vision/resnet:stable",
    "a read token can't do this (needs submit)",
    "the archive member 'data/w.bin' declares 5 bytes",
])
def test_everything_else_is_left_alone(text: str) -> None:
    assert redact(text, ROOTS) == text


def test_the_error_body_is_redacted_in_message_and_hint() -> None:
    exc = StorageError("cannot write /srv/farm-x/blobs/tmp.1", hint="free space under /srv/farm-x")
    body = error_response(exc, ROOTS).body.decode()
    assert "/srv/farm-x" not in body and REDACTED in body
    assert error_response(InvalidModelError("x")).status_code == 400
