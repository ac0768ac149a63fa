"""One conformance suite for every BlobStore: LocalBlobStore and S3BlobStore on a real SeaweedFS."""

from __future__ import annotations

import hashlib
import io
import os
import urllib.request
from pathlib import Path

import pytest

from farm.core.errors import BlobNotFound, DigestMismatchError, StorageError, StorageUnavailable
from farm.core.keys import sha256_bytes
from registry.store.base import BlobStore, download, exists, put_bytes, read_bytes

PART = 5 * 1024 * 1024  # S3's smallest multipart part


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        from registry.store.local import LocalBlobStore

        return LocalBlobStore(tmp_path / "blobs")
    from urllib.parse import parse_qs, urlparse

    from registry.store.s3 import S3BlobStore

    url = request.getfixturevalue("s3_url")
    u = urlparse(url)
    return S3BlobStore(u.netloc, u.path, endpoint=parse_qs(u.query)["endpoint"][0], part_size=PART)


def test_small_round_trip(store: BlobStore) -> None:
    info = put_bytes(store, b"hello ctxfarm")
    assert info.digest == sha256_bytes(b"hello ctxfarm") and info.size == 13
    assert read_bytes(store, info.digest) == b"hello ctxfarm"
    assert store.stat(info.digest).size == 13
    assert [b.digest for b in store.iter_blobs()] == [info.digest]


def test_empty_blob(store: BlobStore) -> None:
    info = put_bytes(store, b"")
    assert info.size == 0 and read_bytes(store, info.digest) == b""


def test_multipart_with_known_digest(store: BlobStore) -> None:
    data = os.urandom(2 * PART + 12345)
    info = store.put_stream(io.BytesIO(data), expected=sha256_bytes(data))
    assert info.size == len(data)
    with store.open(info.digest) as f:
        h = hashlib.sha256()
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert "sha256:" + h.hexdigest() == info.digest


def test_multipart_with_unknown_digest_lands_at_its_address(store: BlobStore) -> None:
    data = os.urandom(PART + 7)
    info = store.put_stream(io.BytesIO(data))
    assert info.digest == sha256_bytes(data)
    assert read_bytes(store, info.digest) == data
    assert [b.digest for b in store.iter_blobs()] == [info.digest], "no temporary upload may remain listed"


@pytest.mark.parametrize("size", [100, PART + 1])
def test_digest_mismatch_stores_nothing(store: BlobStore, size: int) -> None:
    data = os.urandom(size)
    wrong = sha256_bytes(b"something else")
    with pytest.raises(DigestMismatchError):
        store.put_stream(io.BytesIO(data), expected=wrong)
    assert not exists(store, wrong) and not exists(store, sha256_bytes(data))
    assert list(store.iter_blobs()) == []
    if hasattr(store, "client"):
        ups = store.client.list_multipart_uploads(  # type: ignore[attr-defined]
            Bucket=store.bucket, Prefix=store.prefix).get("Uploads", [])  # type: ignore[attr-defined]
        assert ups == [], "a refused multipart upload must be aborted"


def test_idempotent_reput(store: BlobStore) -> None:
    a = put_bytes(store, b"same")
    b = put_bytes(store, b"same", expected=a.digest)
    assert a == b and len(list(store.iter_blobs())) == 1


def test_missing_blob(store: BlobStore) -> None:
    d = sha256_bytes(b"never stored")
    with pytest.raises(BlobNotFound):
        store.stat(d)
    with pytest.raises(BlobNotFound):
        with store.open(d) as f:
            f.read()
    store.delete(d)  # deleting a missing blob is fine


def test_delete(store: BlobStore) -> None:
    info = put_bytes(store, b"bye")
    store.delete(info.digest)
    assert not exists(store, info.digest)


def test_download_verifies_and_is_atomic(store: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(PART + 3)
    info = put_bytes(store, data)
    dest = tmp_path / "out" / "file.bin"
    download(store, info.digest, dest, size=len(data))
    assert dest.read_bytes() == data
    with pytest.raises(DigestMismatchError):
        download(store, info.digest, tmp_path / "out" / "wrong.bin", size=len(data) + 1)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["file.bin"], "no partial file left"


def test_not_a_digest_is_refused(store: BlobStore) -> None:
    with pytest.raises(StorageError):
        store.stat("sha256:../../etc/passwd")


def test_s3_presigned_get(s3_url: str) -> None:
    from registry.store import open_store

    store = open_store(s3_url)
    info = put_bytes(store, b"for a device")
    url = store.presign(info.digest, 60)  # type: ignore[attr-defined]
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"for a device"


def test_s3_unreachable_is_storage_unavailable() -> None:
    from farm.services import free_port
    from registry.store.s3 import S3BlobStore

    with pytest.raises(StorageUnavailable):
        S3BlobStore("ctxfarm-down", "x", endpoint=f"http://127.0.0.1:{free_port()}", max_attempts=1)
