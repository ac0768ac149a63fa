"""The helpers every caller uses (download, read_bytes, ...), against each implementation we can run
without a server: LocalBlobStore and the InMemoryBlobStore fake."""

from __future__ import annotations

import io
import os

import pytest

from farm.core.errors import BlobNotFound, DigestMismatchError, StorageError
from farm.core.keys import sha256_bytes
from registry.store.base import BlobStore, blob_key, check_digest, download, exists, put_bytes, put_file, read_bytes
from registry.store.local import LocalBlobStore
from tests.common.store import InMemoryBlobStore

DATA = bytes(range(256)) * 5000  # > 1 MiB: several chunks
DIGEST = sha256_bytes(DATA)


class LocalTamper(LocalBlobStore):
    def tamper(self, digest: str, data: bytes) -> None:
        self.path_of(digest).write_bytes(data)


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalTamper(tmp_path / "store")
    return InMemoryBlobStore()


def test_implements_protocol(store):
    assert isinstance(store, BlobStore)


def test_blob_key():
    assert blob_key("sha256:" + "ab" + "0" * 62) == "blobs/sha256/ab/ab" + "0" * 62
    with pytest.raises(StorageError):
        blob_key("ab" + "0" * 62)
    assert check_digest(DIGEST) == DIGEST


def test_put_bytes_and_file_and_exists(store, tmp_path):
    assert not exists(store, DIGEST)
    assert put_bytes(store, DATA).digest == DIGEST
    assert exists(store, DIGEST)
    (tmp_path / "f").write_bytes(b"file")
    assert put_file(store, tmp_path / "f", expected=sha256_bytes(b"file")).size == 4


def test_put_expected_mismatch(store):
    with pytest.raises(DigestMismatchError):
        put_bytes(store, DATA, expected=sha256_bytes(b"other"))
    assert not exists(store, DIGEST)
    assert list(store.iter_blobs()) == []


def test_read_bytes_verifies(store):
    put_bytes(store, DATA)
    assert read_bytes(store, DIGEST) == DATA
    store.tamper(DIGEST, DATA[:-1] + b"\x00")
    with pytest.raises(DigestMismatchError):
        read_bytes(store, DIGEST)


def test_download(store, tmp_path):
    put_bytes(store, DATA)
    dest = tmp_path / "out" / "nested" / "model_ctx.onnx"
    download(store, DIGEST, dest, size=len(DATA))
    assert dest.read_bytes() == DATA
    assert os.listdir(dest.parent) == ["model_ctx.onnx"]  # no .part- file left


def test_download_replaces_existing_file(store, tmp_path):
    put_bytes(store, DATA)
    dest = tmp_path / "f"
    dest.write_bytes(b"stale")
    download(store, DIGEST, dest)
    assert dest.read_bytes() == DATA


def test_download_of_tampered_blob_creates_nothing(store, tmp_path):
    put_bytes(store, DATA)
    store.tamper(DIGEST, b"evil" + DATA[4:])
    dest = tmp_path / "out" / "model_ctx.onnx"
    with pytest.raises(DigestMismatchError) as info:
        download(store, DIGEST, dest)
    assert info.value.code == "digest-mismatch"
    assert info.value.hint
    assert not dest.exists()
    assert os.listdir(dest.parent) == []


def test_download_keeps_the_old_file_on_mismatch(store, tmp_path):
    put_bytes(store, DATA)
    store.tamper(DIGEST, b"evil")
    dest = tmp_path / "f"
    dest.write_bytes(b"previous good copy")
    with pytest.raises(DigestMismatchError):
        download(store, DIGEST, dest)
    assert dest.read_bytes() == b"previous good copy"


def test_download_size_mismatch(store, tmp_path):
    put_bytes(store, DATA)
    with pytest.raises(DigestMismatchError):
        download(store, DIGEST, tmp_path / "out" / "f", size=len(DATA) + 1)
    assert os.listdir(tmp_path / "out") == []


def test_download_missing_blob(store, tmp_path):
    with pytest.raises(BlobNotFound):
        download(store, DIGEST, tmp_path / "out" / "f")
    assert os.listdir(tmp_path / "out") == []


def test_in_memory_store_streams_in_chunks():
    store = InMemoryBlobStore()
    info = store.put_stream(io.BytesIO(DATA), expected=DIGEST)
    assert [b.digest for b in store.iter_blobs()] == [info.digest]
    store.delete(DIGEST)
    assert not exists(store, DIGEST)
