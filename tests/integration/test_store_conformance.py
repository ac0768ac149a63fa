"""One conformance suite for every BlobStore: LocalBlobStore and S3BlobStore on a real SeaweedFS."""

from __future__ import annotations

import hashlib
import io
import os
import urllib.request
from pathlib import Path
from typing import Any

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
    from infra.devfarm.services import free_port
    from registry.store.s3 import S3BlobStore

    with pytest.raises(StorageUnavailable):
        S3BlobStore("ctxfarm-down", "x", endpoint=f"http://127.0.0.1:{free_port()}", max_attempts=1)


# -- compressed storage (S3BlobStore: one-part blobs that zstd shrinks by a tenth or more) ------

def compressible(n: int) -> bytes:
    """Like a context binary of the light test models: long runs, a little structure."""
    return (b"\x00" * 4000 + os.urandom(96)) * (n // 4096) + b"\x07" * (n % 4096)


@pytest.mark.parametrize("size", [64 * 1024, 3 * 1024 * 1024 + 17])
def test_compressible_blob_reads_back_as_itself(store: BlobStore, tmp_path: Path, size: int) -> None:
    data = compressible(size)
    info = put_bytes(store, data)
    assert info.size == size and store.stat(info.digest).size == size
    assert read_bytes(store, info.digest) == data
    with store.open(info.digest) as f:  # small reads, as the API's ranged reads and the bundle cache do
        got = b"".join(iter(lambda: f.read(1000), b""))
    assert got == data
    download(store, info.digest, tmp_path / "d.bin", size=size)
    assert (tmp_path / "d.bin").read_bytes() == data


def _object(store: Any, digest: str) -> dict[str, Any]:
    from registry.store.base import blob_key

    head: dict[str, Any] = store.client.head_object(Bucket=store.bucket, Key=store._key(blob_key(digest)))
    return head


def test_s3_stores_a_compressible_blob_compressed(s3_url: str) -> None:
    from registry.store import open_store

    store: Any = open_store(s3_url)
    data = compressible(2 * 1024 * 1024)
    info = put_bytes(store, data)
    head = _object(store, info.digest)
    assert head.get("ContentEncoding") == "zstd" and head["Metadata"] == {"ctxfarm-size": str(len(data))}
    assert head["ContentLength"] < len(data) // 10
    assert store.stat(info.digest).encoding == "zstd" and info.encoding == "zstd"
    # A listing sees the bytes as stored (what gc frees), a stat the blob's own size.
    assert [(b.digest, b.size) for b in store.iter_blobs()] == [(info.digest, head["ContentLength"])]
    # A presigned URL serves the object as stored, and says so.
    with urllib.request.urlopen(store.presign(info.digest, 60), timeout=10) as r:
        assert r.headers.get("Content-Encoding") == "zstd"
        import zstandard

        assert zstandard.ZstdDecompressor().decompress(r.read()) == data


@pytest.mark.parametrize("data", [os.urandom(256 * 1024), os.urandom(3 * 1024 * 1024), b"\x00" * (60 * 1024)],
                         ids=["incompressible", "incompressible-sampled", "small"])
def test_s3_stores_as_is_what_compression_would_not_pay_for(s3_url: str, data: bytes) -> None:
    from registry.store import open_store

    store: Any = open_store(s3_url)
    info = put_bytes(store, data)
    head = _object(store, info.digest)
    assert head.get("ContentEncoding") is None and head["ContentLength"] == len(data)
    assert store.stat(info.digest).encoding is None and read_bytes(store, info.digest) == data


def test_s3_compress_off_stores_as_is_and_still_reads_compressed_blobs(s3_url: str) -> None:
    from registry.store import open_store

    on: Any = open_store(s3_url)
    off: Any = open_store(s3_url + "&compress=0")
    a, b = compressible(1024 * 1024), compressible(512 * 1024)
    packed, plain = put_bytes(on, a), put_bytes(off, b)
    assert _object(on, packed.digest).get("ContentEncoding") == "zstd"
    assert _object(off, plain.digest).get("ContentEncoding") is None
    assert read_bytes(off, packed.digest) == a and read_bytes(on, plain.digest) == b


@pytest.mark.parametrize("query", ["&compress=maybe", "&retries=many"])
def test_s3_bad_store_url_options_are_config_errors(s3_url: str, query: str) -> None:
    from farm.core.errors import ConfigError
    from registry.store import open_store

    with pytest.raises(ConfigError) as exc:
        open_store(s3_url + query)
    assert exc.value.hint


def _plant(store: Any, digest: str, body: bytes, **extra: Any) -> None:
    from registry.store.base import blob_key

    store.client.put_object(Bucket=store.bucket, Key=store._key(blob_key(digest)), Body=body, **extra)


def test_s3_tampered_compressed_objects_never_read_as_the_blob(s3_url: str, tmp_path: Path) -> None:
    """An object altered in the bucket: garbage behind the zstd header, a bomb that decodes far
    past its recorded size, a missing size. Each read fails with digest-mismatch, writes no
    more than the recorded size, and leaves no partial file."""
    import zstandard

    from registry.store import open_store

    store: Any = open_store(s3_url)
    data = compressible(1024 * 1024)
    digest = sha256_bytes(data)
    meta = {"Metadata": {"ctxfarm-size": str(len(data))}, "ContentEncoding": "zstd"}
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\x00" * (256 * 1024 * 1024))
    cases = {
        "garbage": (os.urandom(5000), meta),
        "bomb": (bomb, meta),
        "no-size": (zstandard.ZstdCompressor().compress(data), {"ContentEncoding": "zstd"}),
        "wrong-content": (zstandard.ZstdCompressor().compress(compressible(len(data))), meta),
    }
    for name, (body, extra) in cases.items():
        _plant(store, digest, body, **extra)
        with pytest.raises(DigestMismatchError):
            read_bytes(store, digest)
        dest = tmp_path / name / "f.bin"
        with pytest.raises(DigestMismatchError):
            download(store, digest, dest, size=len(data))
        assert not dest.parent.exists() or list(dest.parent.iterdir()) == [], name
    _plant(store, digest, bomb, **meta)
    with store.open(digest) as f:
        n = 0
        with pytest.raises(DigestMismatchError):
            while chunk := f.read(1 << 20):
                n += len(chunk)
        assert n <= len(data), "a bomb is stopped at the recorded size"


# -- large blobs read as parallel ranges (S3BlobStore.read_ranges) --------------------------------

def test_a_large_blob_downloads_as_parallel_ranges_and_is_still_verified(
        store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob past ``RANGED_MIN`` comes down as ranged GETs, several at once, written in order
    and verified as one: the same bytes; a blob whose recorded size is not the store's is refused
    before anything lands; a compressed blob (its ranges are not the blob's) reads as one stream."""
    import registry.store.base as base
    import registry.store.s3 as s3

    monkeypatch.setattr(base, "RANGED_MIN", 1)
    monkeypatch.setattr(s3, "RANGE_SIZE", 1 << 20)
    data = os.urandom(5 * (1 << 20) + 333)  # 6 ranges: more than RANGE_STREAMS in flight
    info = store.put_stream(io.BytesIO(data), expected=sha256_bytes(data))
    ranges: list[str] = []
    client = getattr(store, "client", None)
    if client is not None:
        def seen(params: Any, **kw: Any) -> None:
            if params.get("Range"):
                ranges.append(params["Range"])

        client.meta.events.register("provide-client-params.s3.GetObject", seen)
    download(store, info.digest, tmp_path / "out.bin", size=len(data))
    assert (tmp_path / "out.bin").read_bytes() == data
    if client is not None:
        assert len(ranges) == 6 and ranges[-1] == f"bytes={5 << 20}-{len(data) - 1}"
    with pytest.raises(DigestMismatchError):
        download(store, info.digest, tmp_path / "short.bin", size=len(data) - 1)
    assert not (tmp_path / "short.bin").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".part-")] == []
    packed = compressible(256 * 1024)
    small = put_bytes(store, packed)
    if client is not None:
        assert store.stat(small.digest).encoding == "zstd"
    download(store, small.digest, tmp_path / "packed.bin", size=len(packed))
    assert (tmp_path / "packed.bin").read_bytes() == packed
