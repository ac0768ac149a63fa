"""InMemoryBlobStore: a BlobStore fake for unit tests (registry/store/base.py's protocol)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import BinaryIO

from farm.core.errors import BlobNotFound, DigestMismatchError
from farm.core.keys import CHUNK
from registry.store.base import BlobInfo, check_digest


class InMemoryBlobStore:
    """Blobs in a dict, verified on the way in like the real stores.

    ``tamper`` replaces a stored blob's bytes without changing its key, the way a corrupt disk
    or a hostile bucket would, so tests can check that readers verify digests.
    """

    def __init__(self, url: str = "memory://"):
        self.url = url
        self.blobs: dict[str, tuple[bytes, datetime]] = {}

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        if expected is not None:
            check_digest(expected)
        h = hashlib.sha256()
        parts = []
        while chunk := stream.read(CHUNK):
            h.update(chunk)
            parts.append(chunk)
        digest = "sha256:" + h.hexdigest()
        if expected is not None and digest != expected:
            raise DigestMismatchError(f"upload does not match its digest: expected {expected}, got {digest}")
        data = b"".join(parts)
        self.blobs[digest] = (data, datetime.now(UTC))
        return BlobInfo(digest, len(data))

    @contextmanager
    def open(self, digest: str) -> Iterator[BinaryIO]:
        data, _ = self._get(digest)
        yield io.BytesIO(data)

    def stat(self, digest: str) -> BlobInfo:
        data, modified = self._get(digest)
        return BlobInfo(digest, len(data), modified)

    def delete(self, digest: str) -> None:
        self.blobs.pop(check_digest(digest), None)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        for digest in sorted(self.blobs):
            data, modified = self.blobs[digest]
            yield BlobInfo(digest, len(data), modified)

    def tamper(self, digest: str, data: bytes) -> None:
        _, modified = self._get(digest)
        self.blobs[digest] = (data, modified)

    def _get(self, digest: str) -> tuple[bytes, datetime]:
        try:
            return self.blobs[check_digest(digest)]
        except KeyError:
            raise BlobNotFound(f"blob {digest} not in {self.url}") from None


class FailingBlobStore:
    """Wraps a real store and fails the Nth put (a crash or outage mid-publication)."""

    def __init__(self, inner: object, fail_on_put: int):
        self.inner = inner
        self.url = getattr(inner, "url", "failing://")
        self.fail_on_put = fail_on_put
        self.puts = 0

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        from farm.core.errors import StorageUnavailable

        self.puts += 1
        if self.puts == self.fail_on_put:
            raise StorageUnavailable(f"injected failure on put #{self.puts}")
        return self.inner.put_stream(stream, expected=expected)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)
