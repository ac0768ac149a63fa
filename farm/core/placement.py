"""Atomic placement of a directory of files (stdlib only: the device client uses it too).

``staged(out)`` yields a fresh sibling staging directory under an exclusive lock; on a clean exit
the staging directory is swapped with ``out`` by ``renameat2(RENAME_EXCHANGE)``, so ``out`` holds
either its previous content or the complete new one. Leftovers of an install that was killed
(``.<out>.ctxfarm-*`` siblings) are removed by the next one into the same place.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from farm.core.errors import InstallConflictError

STAGING_MARK = ".ctxfarm-"
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def destination(out_dir: Path) -> Path:
    """``out_dir`` made absolute; a conflict (a file where the directory must go) is an error
    before anything moves."""
    try:
        out = Path(os.path.abspath(out_dir))
        if out.is_symlink():
            out = out.resolve()
        if out.exists() and not out.is_dir():
            raise InstallConflictError(f"{out_dir} exists and is not a directory: nothing was changed")
        if out.parent == out:
            raise InstallConflictError("refusing to install into the root directory")
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallConflictError(f"cannot install into {out_dir}: {exc.strerror or exc}") from None
    return out


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A staging directory for ``out``; swapped into place when the block exits cleanly."""
    with _lock(out):
        _clean_leftovers(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING_MARK}new-", dir=out.parent))
        try:
            yield staging
            os.chmod(staging, 0o755 & ~_umask())
            _swap(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing) for the block."""
    import fcntl

    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def _lock(out: Path) -> Iterator[None]:
    """An exclusive lock on ``out``'s place, whose file is removed when released: no empty
    ``.<out>.ctxfarm-lock`` is left beside an install. Whoever opened the file before it was
    removed finds, once it holds its lock, that the path names another file (or none) and
    tries again: two holders never lock two different files."""
    import fcntl

    path = out.parent / f".{out.name}{STAGING_MARK}lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            held = os.fstat(fd)
            if now is not None and (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # still holding it: a waiter re-checks and retries
        finally:
            os.close(fd)  # releases the lock


def _clean_leftovers(out: Path) -> None:
    """Staging dirs of installs that were killed (we hold the lock: nobody else is writing)."""
    prefix = f".{out.name}{STAGING_MARK}"
    for p in out.parent.iterdir():
        # "-partial" holds resumable downloads of the device client: kept across interruptions.
        if (p.name.startswith(prefix) and not p.name.endswith(("lock", "partial")) and p.is_dir()
                and not p.is_symlink()):
            shutil.rmtree(p, ignore_errors=True)
    if out.is_dir():  # older ctxfarm staged inside --out itself
        for p in out.iterdir():
            if p.name.startswith(".ctxfarm-fetch-") and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)


def _swap(staging: Path, out: Path) -> None:
    """``out`` becomes the staging dir; its old content ends in ``staging`` (then removed)."""
    if not out.exists():
        os.rename(staging, out)
        staging.mkdir()  # the caller removes it
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        rc = renameat2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD, os.fsencode(out), _RENAME_EXCHANGE)
        if rc == 0:
            return
    # No atomic exchange here (old kernel or libc, some filesystems): two renames, the window
    # between them is where out is briefly absent.
    old = out.parent / f".{out.name}{STAGING_MARK}old-{time.time_ns()}"
    os.rename(out, old)
    os.rename(staging, out)
    os.rename(old, staging)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
