"""LocalBlobStore: a content-addressed directory. Atomic writes: temp file, fsync, rename."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from farm.core.errors import BlobNotFound, DigestMismatchError, StorageError
from farm.core.keys import CHUNK
from registry.store.base import BlobInfo, blob_key, check_digest, foreign_entry

_HEX64 = re.compile(r"[0-9a-f]{64}")
RACY_NS = 1_000_000_000
VERIFIED_MAX = 65536  # blobs a store object remembers having hashed


class LocalBlobStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.url = f"file://{self.root}"
        self._tmp = self.root / "tmp"
        # Blobs this object hashed (as it wrote them, or as ``verified_path`` read them), by the
        # stat of the file it hashed: a blob whose file is still that one is not read again.
        self._verified: dict[str, tuple[int, int, int, int]] = {}
        self.hashes = 0  # blobs ``verified_path`` had to read (tests count them)
        try:
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create blob store at {self.root}: {exc}") from None

    def _path(self, digest: str) -> Path:
        return self.root / blob_key(digest)

    def put_stream(self, stream: BinaryIO, *, expected: str | None = None) -> BlobInfo:
        if expected is not None:
            check_digest(expected)
        fd, tmp = tempfile.mkstemp(prefix="up-", dir=self._tmp)
        try:
            h = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            digest = "sha256:" + h.hexdigest()
            if expected is not None and digest != expected:
                raise DigestMismatchError(f"upload does not match its digest: expected {expected}, got {digest}")
            final = self._path(digest)
            final.parent.mkdir(parents=True, exist_ok=True)
            # Same content, same name: replacing an existing blob is harmless and keeps it whole.
            os.replace(tmp, final)
            _fsync_dir(final.parent)
            self._remember(digest, final)
            return BlobInfo(digest, size)
        except OSError as exc:
            raise StorageError(f"writing blob failed: {exc}") from None
        finally:
            Path(tmp).unlink(missing_ok=True)

    @contextmanager
    def open(self, digest: str) -> Iterator[BinaryIO]:
        try:
            f = open(self._path(digest), "rb")
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not in {self.url}") from None
        with f:
            yield f

    def stat(self, digest: str) -> BlobInfo:
        try:
            st = self._path(digest).stat()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not in {self.url}") from None
        return BlobInfo(digest, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def delete(self, digest: str) -> None:
        self._path(digest).unlink(missing_ok=True)

    def iter_blobs(self) -> Iterator[BlobInfo]:
        base = self.root / "blobs" / "sha256"
        if not base.exists():
            return
        for sub in sorted(base.iterdir()):
            if not sub.is_dir() or sub.is_symlink():
                yield foreign_entry(str(sub.relative_to(self.root)))
                continue
            for p in sorted(sub.iterdir()):
                rel = str(p.relative_to(self.root))
                if p.name.startswith(".") and p.is_file():
                    continue  # an upload in flight (temp file, renamed into place when verified)
                if (not _HEX64.fullmatch(p.name) or p.name[:2] != sub.name or not p.is_file()
                        or p.is_symlink()):
                    yield foreign_entry(rel)
                    continue
                st = p.stat()
                yield BlobInfo("sha256:" + p.name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC))

    def path_of(self, digest: str) -> Path:
        """Local path of a blob (local store only; lets fetch hard-link or copy cheaply)."""
        return self._path(digest)

    def verified_path(self, digest: str) -> Path:
        """The blob's file once its content is known to match ``digest``: hashed here unless
        this object hashed that very file before (as ``put_stream`` wrote it, or read here when
        it was over a second old) and its stat (inode, size, mtime) has not changed since. ``BlobNotFound``, or
        ``DigestMismatchError`` for a blob altered in place (``farm registry verify`` finds it)."""
        from farm.core.keys import sha256_file

        path = self._path(digest)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise BlobNotFound(f"blob {digest} not in {self.url}") from None
        if self._verified.get(digest) == _sig(st):
            return path
        self.hashes += 1
        began = time.time_ns()
        got, _ = sha256_file(path)
        if got != digest:
            raise DigestMismatchError(f"blob {digest} does not match its digest (tampered or corrupt)",
                                      hint="the stored blob was altered or corrupted; run `farm registry verify`")
        # Not remembered when changed within the filesystem's timestamp granularity ("racy git").
        if _sig(path.stat()) == _sig(st) and st.st_mtime_ns < began - RACY_NS:
            self._remember(digest, path)
        return path

    def hashed(self, digest: str, st: os.stat_result) -> bool:
        """Whether ``st`` is the stat of this store's blob ``digest`` as this object hashed it
        (a hard link of it, unchanged since): its content is known without reading it."""
        return self._verified.get(digest) == _sig(st)

    def _remember(self, digest: str, path: Path) -> None:
        try:
            sig = _sig(path.stat())
        except OSError:
            self._verified.pop(digest, None)
            return
        if len(self._verified) >= VERIFIED_MAX:  # a long-lived service's store: the oldest go first
            for old in list(self._verified)[:VERIFIED_MAX // 4]:
                self._verified.pop(old, None)
        self._verified[digest] = sig


def _sig(st: os.stat_result) -> tuple[int, int, int, int]:
    # Not ctime: a hard link or a chmod (a read-only link of the blob) changes it, not the bytes.
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
