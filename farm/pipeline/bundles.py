"""The executor's cache of model snapshots by digest: each bundle comes from the store once.

Layout: ``<root>/<hex of the model digest>/`` holds the bundle's files under their canonical
names and ``.listing.json`` (what was stored). An entry is placed atomically
(``farm.core.placement.staged``): a fetch killed half-way leaves no entry, only a staging dir
the next placement of that digest removes. A job gets hard links of the entry's files in its own
dir (copies across filesystems) and then verifies *those* (size and sha256 against the model
row): what is checked is what is compiled, eviction never pulls a file from under a running
compile, and a corrupted entry is fetched again. Several executors on one host may share a root:
placement is locked per digest, and a fetcher that finds the entry placed meanwhile uses it.
Bounded in size: least recently used entries go first.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError, StorageError
from farm.core.keys import is_digest, sha256_file
from farm.core.names import UnsafePathError, inside
from farm.core.placement import STAGING_MARK, staged

log = logging.getLogger("ctxfarm.bundles")

LISTING = ".listing.json"
# A job dir's name: this, the owning process's pid, "-" (farm.pipeline.execute.sweep_job_dirs
# removes those whose owner is gone).
JOB_PREFIX = "ctxfarm-job-"


class _PlacedMeanwhile(Exception):
    """Another fetcher placed the entry while we waited for the lock: keep theirs."""


def check_files(files: list[dict[str, Any]]) -> None:
    if not files or not all(f.get("stored") for f in files):
        raise StorageError("the model snapshot was never stored",
                           hint="submit the model again (farm build / farm submit store it first)")


def lay_out(dest: Path, files: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Path]]:
    """(listing entry, path under ``dest``) for every file; a name that would leave ``dest``
    (a tampered row) is refused."""
    out = []
    for f in files:
        try:
            out.append((f, inside(dest, str(f["path"]))))
        except UnsafePathError as exc:
            raise StorageError(f"the stored model snapshot lists an unsafe path: {exc}") from None
    return out


def download_bundle(store: Any, files: list[dict[str, Any]], dest: Path) -> Path:
    """Every file of the snapshot from the store into ``dest`` (each verified); the .onnx path."""
    from registry.store.base import download

    check_files(files)
    dest.mkdir(parents=True, exist_ok=True)
    first: dict[str, Path] = {}
    for f, path in lay_out(dest, files):
        seen = first.get(f["digest"])
        if seen is not None:
            # One external-data file used by several graphs (a group's prefill and decode): it
            # comes from the store once and sits once on disk, a hard link under each name.
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            try:
                os.link(seen, path)
            except OSError:
                shutil.copyfile(seen, path)
            continue
        download(store, f["digest"], path, size=int(f["size"]))
        first[f["digest"]] = path
    return dest / files[0]["path"]


def verify(files: list[dict[str, Any]], dest: Path, store: Any = None) -> bool:
    """Every file present under ``dest`` with its recorded size and sha256. A file hard-linked
    under several names (a group's prefill and decode sharing one external-data file) is read
    once: the names are one inode, one content. ``store``: a local store's blob that this very
    store object hashed as it wrote it (``LocalBlobStore.hashed``: the same inode, unchanged
    since) is not read again through its link."""
    read: dict[tuple[int, int], str] = {}
    hashed = getattr(store, "hashed", None)
    try:
        for f, path in lay_out(dest, files):
            if path.is_symlink() or not path.is_file():
                return False
            st = path.stat()
            if st.st_size != int(f["size"]):
                return False
            if hashed is not None and hashed(f["digest"], st):
                continue
            got = read.get((st.st_dev, st.st_ino))
            if got is None:
                got = read[(st.st_dev, st.st_ino)] = sha256_file(path)[0]
            if got != f["digest"]:
                return False
    except OSError:
        return False
    return True


def link_from_store(store: Any, files: list[dict[str, Any]], dest: Path) -> bool:
    """Lay the snapshot out in ``dest`` as hard links of a local store's blobs (``path_of``): no
    copy of the weights. Each link is made read-only (it is the store's blob: the same inode).
    Nothing is verified here: whoever uses ``dest`` verifies what it reads (``verify``), as it
    would a copy. False (and nothing left in ``dest``) when the store is not local, a blob is
    missing or its size differs, or links can't be made (another filesystem): the caller
    downloads instead."""
    path_of = getattr(store, "path_of", None)
    if path_of is None:
        return False
    made: list[Path] = []
    try:
        for f, path in lay_out(dest, files):
            src = path_of(f["digest"])
            if src.stat().st_size != int(f["size"]):
                raise OSError(f"blob {f['digest']} has another size")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
            os.link(src, path)
            made.append(path)
            os.chmod(path, 0o444)
    except (OSError, ValueError, StorageError):
        for path in made:
            path.unlink(missing_ok=True)
        return False
    return True


class BundleCache:
    """Model snapshots by digest under ``root``, at most ``max_bytes`` in all."""

    def __init__(self, root: Path, max_bytes: int):
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.hits = self.misses = 0

    def entry(self, model_digest: str) -> Path:
        if not is_digest(model_digest):
            raise StorageError(f"not a model digest: {model_digest[:80]!r}")
        return self.root / model_digest.removeprefix("sha256:")

    def fetch(self, store: Any, model_digest: str, files: list[dict[str, Any]], dest: Path) -> tuple[Path, bool]:
        """Lay the snapshot out in ``dest`` (an empty dir of this job); returns (.onnx path,
        whether it came from the cache). Every file in ``dest`` is verified either way."""
        check_files(files)
        entry = self.entry(model_digest)
        if self._link(entry, files, dest, store):
            self.hits += 1
            _touch(entry / LISTING)
            return dest / files[0]["path"], True
        self.misses += 1
        try:
            self._place(store, entry, files)
        except OSError as exc:  # a full or read-only cache dir costs the cache, never the build
            log.warning("bundle cache at %s unusable (%s): fetching into the job dir", self.root, exc)
            shutil.rmtree(dest, ignore_errors=True)
            return download_bundle(store, files, dest), False
        if not self._link(entry, files, dest, store):
            # Evicted or replaced under us (a near-full cache shared by busy executors): fetch
            # this job's copy straight from the store.
            shutil.rmtree(dest, ignore_errors=True)
            return download_bundle(store, files, dest), False
        self._evict(keep=entry)
        return dest / files[0]["path"], False

    def place(self, store: Any, model_digest: str, files: list[dict[str, Any]]) -> None:
        """The snapshot placed in the cache ahead of the job that will ``fetch`` it (a worker's
        next build, ``Executor._prefetch_next``); nothing if it is there already."""
        check_files(files)
        entry = self.entry(model_digest)
        if (entry / LISTING).is_file():
            return
        self._place(store, entry, files)
        self._evict(keep=entry)

    # -- internals -----------------------------------------------------------------------------

    def _link(self, entry: Path, files: list[dict[str, Any]], dest: Path, store: Any = None) -> bool:
        """Hard-link (or copy) the entry's files into ``dest`` and verify them there."""
        if not (entry / LISTING).is_file():
            return False
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for (_, src), (_, dst) in zip(lay_out(entry, files), lay_out(dest, files), strict=True):
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.unlink(missing_ok=True)
                try:
                    os.link(src, dst)
                except OSError:  # another filesystem (EXDEV), or links not allowed here
                    shutil.copyfile(src, dst)
        except OSError:
            return False  # evicted or being replaced meanwhile
        if verify(files, dest, store):
            return True
        log.warning("bundle cache entry %s does not match its digests: fetching it again", entry.name)
        for _, dst in lay_out(dest, files):
            dst.unlink(missing_ok=True)
        return False

    def _place(self, store: Any, entry: Path, files: list[dict[str, Any]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            with staged(entry) as staging:
                # We hold the digest's lock now: another executor may have placed it meanwhile.
                if (entry / LISTING).is_file() and verify(files, entry):
                    raise _PlacedMeanwhile
                # A local store's blobs are linked, not copied (the job verifies its links).
                if not link_from_store(store, files, staging):
                    download_bundle(store, files, staging)
                for _, path in lay_out(staging, files):
                    os.chmod(path, 0o444)  # a job's hard link must not be able to change the entry
                (staging / LISTING).write_text(json.dumps(files, sort_keys=True))
        except _PlacedMeanwhile:
            pass

    def _evict(self, keep: Path) -> None:
        """Remove least recently used entries until the cache fits (never ``keep``)."""
        try:
            entries = []
            total = 0
            for d in self.root.iterdir():
                listing = d / LISTING
                if d.name.startswith(".") or not listing.is_file():
                    continue
                # A file hard-linked under two names (shared external data) counts once.
                size = sum({(st.st_dev, st.st_ino): st.st_size
                            for st in (p.stat() for p in d.rglob("*") if p.is_file())}.values())
                entries.append((listing.stat().st_mtime, size, d))
                total += size
        except OSError:
            return
        for _, size, d in sorted(entries):
            if total <= self.max_bytes:
                break
            if d == keep:
                continue
            # Renamed out of the way first: a job linking from it meanwhile fails cleanly and
            # fetches again; the placement of that digest removes the leftover if we die here.
            gone = d.parent / f".{d.name}{STAGING_MARK}evicted-{time.time_ns()}"
            try:
                os.rename(d, gone)
            except OSError:
                continue
            shutil.rmtree(gone, ignore_errors=True)
            total -= size


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass


def open_cache(home: Path, max_mb: int) -> BundleCache | None:
    if max_mb <= 0:
        return None
    return BundleCache(home / "cache" / "bundles", max_mb * 1024 * 1024)



NAMES_HINT = "list each file once, under its name relative to the folder (no '..', no absolute path)"


def lay_out_blobs(store: Any, files: list[tuple[str, str, int]], dest: Path, *, max_bytes: int,
                  error: type[FarmError], too_large: str, check_name: Any = None) -> list[tuple[Path, str]]:
    """Files a client named by digest (``POST /v1/models/DIGEST`` with its files, ``POST
    /v1/genai``), from the store into ``dest``. Before a byte is copied: every name a canonical
    relative path (``farm.core.names.check_tree``: unique, none both a file and a directory),
    and ``check_name`` where given (a genai export's plain names), each refusal ``error``; the
    listed sizes within ``max_bytes`` (``too-large``: as much as one upload could bring); every
    blob held by the store at its listed size (``not-found`` naming the file). Then each blob
    comes from the store once (verified on the way; a scratch copy, not synced to disk), a second
    name for it a hard link. Returns (path, digest) of each blob's first copy: digests this
    process computed itself (``farm.core.digests.remember``)."""
    from farm.core.errors import BlobNotFound, NotFoundError, TooLargeError
    from farm.core.keys import is_digest
    from farm.core.names import check_tree
    from registry.store.base import download

    names = [n for n, _, _ in files]
    try:
        check_tree(names)
    except UnsafePathError as exc:
        raise error(f"a file name is not allowed: {exc}", hint=NAMES_HINT) from None
    for n in names:
        if check_name is not None:
            check_name(n)
    if sum(max(int(s), 0) for s in {d: s for _, d, s in files}.values()) > max_bytes:  # each blob copied once
        raise TooLargeError(too_large, hint="raise FARM_MAX_UPLOAD_MB on the service if the model is really that "
                                            "large")
    for n, d, size in files:
        if not is_digest(d):
            raise error(f"{n[:80]!r}: {d[:80]!r} is not a sha256 digest", hint="sha256: and 64 lowercase hex digits")
        try:
            held = store.stat(d).size
        except BlobNotFound:
            held = None
        if held is None or int(held) != int(size):
            raise NotFoundError(f"{n[:80]}: the service does not hold blob {d}" + (
                f" of {size} bytes (it holds {held})" if held is not None else ""),
                hint=f"send it first: PUT /v1/blobs/{d}")
    dest.mkdir(parents=True, exist_ok=True)
    first: dict[str, Path] = {}
    for n, d, size in files:
        path = inside(dest, n)
        path.parent.mkdir(parents=True, exist_ok=True)
        seen = first.get(d)
        if seen is not None:
            try:
                os.link(seen, path)
            except OSError:
                shutil.copyfile(seen, path)
            continue
        download(store, d, path, size=int(size), durable=False)
        first[d] = path
    return [(p, d) for d, p in first.items()]
