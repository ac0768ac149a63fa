"""The BlobStore interface. Blobs are content-addressed: ``blobs/sha256/<ab>/<hex>``.

Implementations: ``LocalBlobStore`` (a directory), ``S3BlobStore`` (any S3-compatible
service). Fakes for unit tests live in ``tests/common``. Every implementation passes the same
conformance suite (``tests/integration/test_store_conformance.py``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager, closing
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from farm.core.errors import BlobNotFound, DigestMismatchError, StorageError
from farm.core.keys import CHUNK, is_digest


@dataclass(frozen=True)
class BlobInfo:
    digest: str  # "" for a foreign entry
    size: int
    modified: datetime | None = None
    foreign: str | None = None  # the key of an entry under blobs/ that is not a blob of ours
    # How the store holds it: None as it is, "zstd" compressed (S3BlobStore). ``size`` is the
    # blob's own size, except from ``iter_blobs`` of such a store: the bytes as stored.
    encoding: str | None = None


def foreign_entry(key: str, size: int = 0) -> BlobInfo:
    return BlobInfo("", size, None, foreign=key)


@runtime_checkable
class BlobStore(Protocol):
    url: str

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        """Store a stream; the blob becomes visible only once its sha256 is verified.

        ``expected``: the digest the caller claims; a mismatch raises DigestMismatchError and
        stores nothing.
        """
        ...

    def open(self, digest: str) -> AbstractContextManager[BinaryIO]:
        """A streamed reader of the blob. Raises BlobNotFound."""
        ...

    def stat(self, digest: str) -> BlobInfo:
        """Size (and mtime) of a blob. Raises BlobNotFound."""
        ...

    def delete(self, digest: str) -> None:
        """Remove a blob; removing a missing blob is not an error."""
        ...

    def iter_blobs(self) -> Iterator[BlobInfo]:
        """Every blob in the store (for verify and gc); anything else found under ``blobs/``
        (a stray file, a misplaced blob) comes as a ``foreign`` entry, never an error."""
        ...


def check_digest(digest: str) -> str:
    if not is_digest(digest):
        raise StorageError(f"not a sha256 digest: {digest!r}")
    return digest


def blob_key(digest: str) -> str:
    hexd = check_digest(digest).removeprefix("sha256:")
    return f"blobs/sha256/{hexd[:2]}/{hexd}"


def exists(store: BlobStore, digest: str) -> bool:
    try:
        store.stat(digest)
    except BlobNotFound:
        return False
    return True


def put_file(store: BlobStore, path: Path, *, expected: str | None = None) -> BlobInfo:
    with open(path, "rb") as f:
        return store.put_stream(f, expected=expected)


def put_bytes(store: BlobStore, data: bytes, *, expected: str | None = None) -> BlobInfo:
    import io

    return store.put_stream(io.BytesIO(data), expected=expected)


def read_bytes(store: BlobStore, digest: str) -> bytes:
    with store.open(digest) as f:
        data = f.read()
    from farm.core.keys import sha256_bytes

    if sha256_bytes(data) != digest:
        raise DigestMismatchError(f"blob {digest} does not match its digest (tampered or corrupt)")
    return data


def download(store: BlobStore, digest: str, dest: Path, *, size: int | None = None, durable: bool = True) -> None:
    """Stream a blob to ``dest`` atomically, verifying size and sha256 on the way. ``durable``:
    on disk before it is in place (False for a scratch copy deleted after the request)."""
    import hashlib
    import os
    import tempfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".part-", dir=dest.parent)
    try:
        h = hashlib.sha256()
        n = 0
        with os.fdopen(fd, "wb") as out, closing(_chunks(store, digest, size)) as chunks:
            for chunk in chunks:
                h.update(chunk)
                n += len(chunk)
                out.write(chunk)
            out.flush()
            if durable:
                os.fsync(out.fileno())
        got = "sha256:" + h.hexdigest()
        if got != digest or (size is not None and n != size):
            raise DigestMismatchError(
                f"blob {digest} for {dest.name} failed verification (got {got}, {n} bytes)",
                hint="the stored blob was altered or corrupted; run `farm registry verify`",
            )
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


RANGED_MIN = 128 * 1024 * 1024  # a blob this large is read as parallel ranges where the store can


class StoredCompressed(Exception):
    """A store's ``read_ranges`` of a blob it holds compressed (its ranges are not the blob's):
    raised before any range is yielded; the blob is read as one stream."""


def _chunks(store: BlobStore, digest: str, size: int | None) -> Generator[bytes, None, None]:
    """The blob's bytes in order: a large one of known size as parallel ranges (``read_ranges``,
    an S3 store's), else one stream."""
    ranged = getattr(store, "read_ranges", None)
    if ranged is not None and size is not None and size >= RANGED_MIN:
        try:
            yield from ranged(digest, size)
            return
        except StoredCompressed:
            pass  # raised before any range was yielded: read it as one stream
    with store.open(digest) as src:
        while chunk := src.read(CHUNK):
            yield chunk


def place(store: BlobStore, digest: str, dest: Path, *, size: int | None = None) -> bool:
    """A blob at ``dest`` for reading (a folder laid out to be checked, never handed out): a
    read-only hard link of a local store's blob, verified once per blob by the store
    (``LocalBlobStore.verified_path``: a blob it wrote or hashed before is not read again), else a
    verified copy (``download``, not made durable: a scratch folder). Returns whether it linked."""
    import os

    verified_path = getattr(store, "verified_path", None)
    if verified_path is not None:
        src = verified_path(digest)
        if size is None or src.stat().st_size == size:
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.unlink(missing_ok=True)
            try:
                os.link(src, dest)
            except OSError:  # another filesystem, or links not allowed here
                pass
            else:
                os.chmod(dest, 0o444)  # the store's inode: nothing reading the folder may change it
                return True
    download(store, digest, dest, size=size, durable=False)
    return False


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
