from __future__ import annotations

import io
import os

import pytest

from farm.core.errors import BlobNotFound, DigestMismatchError, StorageError
from farm.core.keys import sha256_bytes
from registry.store import BlobStore, open_store
from registry.store.base import blob_key, put_bytes
from registry.store.local import LocalBlobStore

DATA = b"context binary bytes" * 1000
DIGEST = sha256_bytes(DATA)


@pytest.fixture
def store(tmp_path) -> LocalBlobStore:
    return LocalBlobStore(tmp_path / "blobs")


def leftovers(store: LocalBlobStore) -> list[str]:
    return os.listdir(store.root / "tmp")


def test_is_a_blob_store(store):
    assert isinstance(store, BlobStore)
    assert store.url == f"file://{store.root}"


def test_put_open_stat(store):
    info = store.put_stream(io.BytesIO(DATA))
    assert (info.digest, info.size) == (DIGEST, len(DATA))
    with store.open(DIGEST) as f:
        assert f.read() == DATA
    st = store.stat(DIGEST)
    assert (st.digest, st.size) == (DIGEST, len(DATA))
    assert st.modified is not None and st.modified.tzinfo is not None
    assert store.path_of(DIGEST) == store.root / blob_key(DIGEST)
    assert store.path_of(DIGEST).read_bytes() == DATA
    assert leftovers(store) == []


def test_layout_is_content_addressed(store):
    hexd = DIGEST.removeprefix("sha256:")
    store.put_stream(io.BytesIO(DATA))
    assert (store.root / "blobs" / "sha256" / hexd[:2] / hexd).is_file()


def test_put_with_matching_expected(store):
    assert store.put_stream(io.BytesIO(DATA), expected=DIGEST).digest == DIGEST


def test_expected_mismatch_stores_nothing(store):
    wrong = sha256_bytes(b"something else")
    with pytest.raises(DigestMismatchError) as info:
        store.put_stream(io.BytesIO(DATA), expected=wrong)
    assert info.value.code == "digest-mismatch"
    assert list(store.iter_blobs()) == []
    assert not store.path_of(DIGEST).exists()
    assert not store.path_of(wrong).exists()
    assert leftovers(store) == []


def test_malformed_expected_digest_refused(store):
    with pytest.raises(StorageError, match="not a sha256 digest"):
        store.put_stream(io.BytesIO(DATA), expected="sha256:abc")
    assert leftovers(store) == []


def test_reput_is_idempotent(store):
    first = store.put_stream(io.BytesIO(DATA))
    second = store.put_stream(io.BytesIO(DATA), expected=DIGEST)
    assert first == second
    assert [b.digest for b in store.iter_blobs()] == [DIGEST]
    assert store.path_of(DIGEST).read_bytes() == DATA
    assert leftovers(store) == []


def test_empty_blob(store):
    info = store.put_stream(io.BytesIO(b""))
    assert info == store.put_stream(io.BytesIO(b""), expected=sha256_bytes(b""))
    assert store.stat(info.digest).size == 0


def test_missing_blob(store):
    with pytest.raises(BlobNotFound) as info:
        with store.open(DIGEST):
            pass
    assert info.value.code == "blob-not-found"
    with pytest.raises(BlobNotFound):
        store.stat(DIGEST)


def test_bad_digest_never_reaches_the_filesystem(store):
    for bad in ("sha256:../../etc/passwd", "../x", "sha256:" + "g" * 64):
        with pytest.raises(StorageError):
            store.stat(bad)
        with pytest.raises(StorageError):
            store.delete(bad)


def test_delete(store):
    store.put_stream(io.BytesIO(DATA))
    store.delete(DIGEST)
    with pytest.raises(BlobNotFound):
        store.stat(DIGEST)
    store.delete(DIGEST)  # deleting a missing blob is not an error


def test_iter_blobs(store):
    assert list(store.iter_blobs()) == []
    digests = sorted(put_bytes(store, bytes([i]) * (i + 1)).digest for i in range(5))
    infos = list(store.iter_blobs())
    assert [b.digest for b in infos] == digests
    assert sorted(b.size for b in infos) == [1, 2, 3, 4, 5]


def test_unwritable_root(tmp_path):
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(StorageError, match="cannot create blob store"):
        LocalBlobStore(tmp_path / "file" / "blobs")


def test_open_store_by_url(tmp_path):
    for url in (f"file://{tmp_path / 'a'}", str(tmp_path / "b")):
        s = open_store(url)
        assert isinstance(s, LocalBlobStore)
        assert s.put_stream(io.BytesIO(DATA)).digest == DIGEST


def test_open_store_unknown_scheme():
    from farm.core.errors import ConfigError

    with pytest.raises(ConfigError):
        open_store("ftp://host/blobs")
