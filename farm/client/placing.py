"""Placing an artifact's files under --dest: each fetched by its digest into a staging folder
beside it (``.<dest>.ctxfarm-partial``, kept across interruptions), then the whole swapped in
atomically (``farm.core.placement``), every path checked to stay under --dest. What --dest
already holds at a file's name and size is taken as it is (a hard link, verified like any
download), so a re-install of an up-to-date destination fetches nothing and moves nothing.
"""

from __future__ import annotations

import os
import shutil
import stat as stat_module
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.client.downloads import Downloads, remove
from farm.client.ranges import kept_bytes
from farm.core.errors import StorageError
from farm.core.names import inside, safe_relative
from farm.core.placement import STAGING_MARK, staged

PARTIAL = "partial"  # .<dest>.ctxfarm-partial: downloads kept across interruptions


def fetch_and_place(client: Downloads, out: Path, files: list[dict[str, Any]], *, connections: int,
                     directories: Sequence[str] = ()) -> tuple[int, int, int]:
    """Every file (``name``, ``digest``, ``size``: already checked) fetched by its digest into a
    staging folder beside ``out`` (each verified, resuming what an earlier try left), then the
    whole swapped into ``out`` atomically, with ``directories`` made even where empty. Files
    ``out`` already holds at their names are taken as they are (a hard link, no byte fetched) and
    verified like any download; when all are, and nothing else is there, nothing moves.
    Returns (bytes resumed, bytes received, bytes kept from ``out``)."""
    sizes = {f["digest"]: f["size"] for f in files}
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        remove(partial)
    partial.mkdir(exist_ok=True)
    reused = _take_placed(out, partial, files)
    _check_room(partial, files)
    resumed = kept = 0
    received = client.received
    for digest, size in sizes.items():
        # Named by the checked digest (64 hex digits), never by anything else the server said.
        got = client.download(digest, partial / digest[7:], size=size, connections=connections)
        if digest in reused and got == size:
            kept += size
        else:
            resumed += got
    downloaded = client.received - received
    if kept == sum(sizes.values()) and _holds_exactly(out, files, directories):
        # Up to date: every file verified where it is, nothing else there; nothing is moved.
        shutil.rmtree(partial, ignore_errors=True)
        return resumed, downloaded, kept
    with staged(out) as staging:
        for d in directories:
            inside(staging, d).mkdir(parents=True, exist_ok=True)
        for f in files:
            target = inside(staging, f["name"])
            target.parent.mkdir(parents=True, exist_ok=True)
            source = partial / f["digest"][7:]
            # A sibling directory, the same filesystem: a hard link (a blob listed twice stays
            # whole for its second name), no second copy of a multi-GB file.
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
    shutil.rmtree(partial, ignore_errors=True)
    return resumed, downloaded, kept


def _placed(out: Path, name: str, is_kind: Any = stat_module.S_ISREG) -> Path | None:
    """``out/name`` where it is a regular file (``is_kind``: another ``stat`` test, e.g. a
    directory's) reached through no symlink, else None."""
    path = out / safe_relative(name)
    try:
        if inside(out, name) != out.resolve() / safe_relative(name) or path.resolve() != path:
            return None
        return path if is_kind(os.stat(path, follow_symlinks=False).st_mode) else None
    except (OSError, ValueError):
        return None


def _take_placed(out: Path, partial: Path, files: list[dict[str, Any]]) -> set[str]:
    """Hard-link into ``partial`` each file ``out`` already holds at its name with its declared
    size, where nothing is kept for its digest yet; the digests so taken. Not yet trusted: the
    download verifies them (a wrong one is fetched again)."""
    taken: set[str] = set()
    if not out.is_dir() or out.is_symlink():
        return taken
    for f in files:
        kept = partial / f["digest"][7:]
        if f["digest"] in taken or kept.exists() or kept.is_symlink():
            continue
        path = _placed(out, f["name"])
        if path is None or path.stat().st_size != f["size"]:
            continue
        try:
            os.link(path, kept)
        except OSError:
            continue  # another filesystem, a link limit: downloaded instead
        taken.add(f["digest"])
    return taken


def _holds_exactly(out: Path, files: list[dict[str, Any]], directories: Sequence[str] = ()) -> bool:
    """``out`` holds the manifest's files and nothing else (directories only on their paths and
    the ``directories`` asked for, each of those there), none a symlink, each the very file taken
    from it (checked by ``_take_placed``'s links: the same inode as the verified copy)."""
    want = {f["name"]: f["digest"] for f in files}
    asked = {"/".join(d.split("/")[:i]) for d in directories for i in range(1, d.count("/") + 2)}
    dirs = {"/".join(n.split("/")[:i]) for n in want for i in range(1, n.count("/") + 1)} | asked
    if any(_placed(out, d, stat_module.S_ISDIR) is None for d in directories):
        return False
    seen = 0
    for root, subdirs, names in os.walk(out):
        rel_root = Path(root).relative_to(out).as_posix()
        for d in subdirs:
            rel = d if rel_root == "." else f"{rel_root}/{d}"
            if rel not in dirs or os.path.islink(os.path.join(root, d)):
                return False
        for n in names:
            rel = n if rel_root == "." else f"{rel_root}/{n}"
            if rel not in want:
                return False
            seen += 1
    if seen != len(want):
        return False
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    for name, digest in want.items():
        path = _placed(out, name)
        if path is None:
            return False
        a, b = os.stat(path, follow_symlinks=False), os.stat(partial / digest[7:], follow_symlinks=False)
        if (a.st_ino, a.st_dev) != (b.st_ino, b.st_dev):
            return False
    return True


def _check_room(partial: Path, files: list[dict[str, Any]]) -> None:
    """Declared sizes that the device's disk can't hold are refused before a byte is fetched (a
    server can't fill a device by declaring a terabyte); files placed are hard links of the
    downloads, so the artifact needs its size once."""
    need = 0
    for digest, size in {f["digest"]: f["size"] for f in files}.items():
        need += max(size - kept_bytes(partial / digest[7:], size), 0)
    free = shutil.disk_usage(partial).free
    if need > free:
        raise StorageError(f"the artifact needs {need} more bytes, {free} are free where --dest is: nothing was "
                           "downloaded", hint="free space on the device or pick a --dest on a larger filesystem")
