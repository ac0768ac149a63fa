"""Digests of local model bundles, remembered by each file's stat (as git's index remembers what
it hashed): re-submitting an unchanged multi-GiB model costs a few ``stat`` calls, not a pass
over its bytes. A file is hashed again whenever its size, mtime, ctime, inode or path changed.

The client side uses this to ask the service whether it already holds a bundle before sending
any of it (``farm submit --server``). The service trusts none of what a client hashed: what it
is sent is hashed there, and what it answers "held" it hashed itself when it was stored. Its own
memo (under its FARM_HOME) holds only digests it computed: the blobs of a genai submission it
verified as it laid them out (``remember``), so reading that folder does not hash them again.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.bundle import ONNX_NAME, inspect_model, model_file
from farm.core.keys import bundle_digest, sha256_file
from farm.core.names import UnsafePathError, inside

MAX_ENTRIES = 4096  # the memo keeps the most recent entries
LONE_MAX_BYTES = 64 * 1024 * 1024  # a lone .onnx up to this size is not inspected here (the service does)


@dataclass(frozen=True)
class LocalBundle:
    digest: str
    size: int
    members: list[tuple[str, Path]]  # (name in the bundle, local file): the .onnx first, as ONNX_NAME
    hashed_bytes: int  # how many bytes this call read to know the digest (0: all remembered)
    files: tuple[tuple[str, str, int], ...] = ()  # (name, digest, size) of each member, in ``members``' order


def local_bundle(path: Path, memo_path: Path | None) -> LocalBundle:
    """The bundle digest of the model at ``path`` (its .onnx and every external-data file),
    reading only files whose stat changed since ``memo_path`` last saw them. A model not seen
    before is validated in full (``inspect_model``: invalid-model before anything is sent),
    unless it is a lone .onnx that can name no external data (``names_no_external_data``, up to
    ``LONE_MAX_BYTES``): then its bundle digest follows from its own hash, and the check is the
    service's alone, which inspects every bundle it is sent whatever the client did (the same
    invalid-model, after a small upload). That spares each ``farm submit --server`` of a new
    small model the onnx import and the checker (~0.25 s of CPU)."""
    model_file(path)  # invalid-model for a loop, a FIFO (its read would block), a dangling symlink...
    memo = _load(memo_path)
    hashed = [0]

    def digest_of(p: Path) -> tuple[str, int]:
        return _remembered(p, memo, hashed)

    onnx_digest, onnx_size = digest_of(path)
    files = [(ONNX_NAME, onnx_digest, onnx_size)]
    layout = memo.get(f"layout:{onnx_digest}")
    members: list[tuple[str, Path]] = [(ONNX_NAME, path)]
    external: list[tuple[str, str]] = []
    size = onnx_size
    if not isinstance(layout, list) and _lone(path, onnx_digest, onnx_size):
        layout = []
        memo[f"layout:{onnx_digest}"] = layout
    if not isinstance(layout, list):
        bundle = inspect_model(path)  # the first time: every check, and its own hashes
        hashed[0] += bundle.size
        layout = [f.path for f in bundle.external]
        memo[f"layout:{onnx_digest}"] = layout
        for f in bundle.external:
            p = inside(path.parent, f.path)
            st = p.stat()
            if st.st_size == f.size:
                memo[_key(st)] = {"sig": _sig(p, st), "digest": f.digest}
    for rel in layout:
        try:
            p = inside(path.parent, str(rel))  # the .onnx names them: they stay inside its directory
        except UnsafePathError:
            return _forget(memo_path, memo, onnx_digest, path)
        if not p.is_file():
            return _forget(memo_path, memo, onnx_digest, path)
        d, n = digest_of(p)
        external.append((str(rel), d))
        members.append((str(rel), p))
        files.append((str(rel), d, n))
        size += n
    _save(memo_path, memo)
    return LocalBundle(bundle_digest(onnx_digest, external), size, members, hashed[0], tuple(files))


def memo_path(home: Path) -> Path:
    """The memo of a FARM_HOME (a client's, a service's)."""
    return Path(home) / "cache" / "digests.json"


def _key(st: os.stat_result) -> str:
    return f"file:{st.st_dev}:{st.st_ino}"


def _sig(p: Path, st: os.stat_result) -> list[Any]:
    """What must be unchanged for a remembered digest to stand."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, str(p.absolute())]


def _remembered(p: Path, memo: dict[str, Any], hashed: list[int]) -> tuple[str, int]:
    """(sha256, size) of ``p``, from ``memo`` while its stat is unchanged; ``hashed[0]``
    counts the bytes read."""
    st = p.stat()
    key, sig = _key(st), _sig(p, st)
    hit = memo.get(key)
    if isinstance(hit, dict) and hit.get("sig") == sig:
        memo[key] = memo.pop(key)  # most recently used last
        return str(hit["digest"]), int(st.st_size)
    digest, size = sha256_file(p)
    hashed[0] += size
    memo[key] = {"sig": sig, "digest": digest}
    return digest, size


def file_digests(paths: list[Path], memo_path: Path | None) -> list[tuple[str, int]]:
    """(sha256, size) of each file, remembered by its stat as ``local_bundle`` remembers a
    bundle's (``farm submit --genai --server`` asks the service for each file by digest)."""
    memo = _load(memo_path)
    out = [_remembered(p, memo, [0]) for p in paths]
    _save(memo_path, memo)
    return out


def remember(memo_path: Path | None, files: list[tuple[Path, str]]) -> None:
    """Digests this process computed itself for files it just wrote (``lay_out_blobs``: each
    blob verified as it was copied), remembered by their stat as if hashed here."""
    memo = _load(memo_path)
    for p, digest in files:
        try:
            st = p.stat()
        except OSError:
            continue
        memo[_key(st)] = {"sig": _sig(p, st), "digest": digest}
    _save(memo_path, memo)


def _lone(path: Path, digest: str, size: int) -> bool:
    """A small .onnx, still the bytes hashed to ``digest``, that names no external-data file."""
    from farm.core.bundle import names_no_external_data
    from farm.core.keys import sha256_bytes

    if size > LONE_MAX_BYTES:
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return names_no_external_data(data) and sha256_bytes(data) == digest


def _forget(memo_path: Path | None, memo: dict[str, Any], onnx_digest: str, path: Path) -> LocalBundle:
    """A remembered layout that no longer holds: inspect the model in full (its error, if any)."""
    memo.pop(f"layout:{onnx_digest}", None)
    _save(memo_path, memo)
    return local_bundle(path, memo_path) if memo_path is not None else local_bundle(path, None)


def _load(memo_path: Path | None) -> dict[str, Any]:
    if memo_path is None:
        return {}
    try:
        data = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(memo_path: Path | None, memo: dict[str, Any]) -> None:
    if memo_path is None:
        return
    while len(memo) > MAX_ENTRIES:
        memo.pop(next(iter(memo)))
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        # One writer per temporary name: the service's request threads each write their own.
        tmp = memo_path.with_name(f".{memo_path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(memo))
        os.replace(tmp, memo_path)
    except OSError:
        pass  # a memo that can't be written costs the next call a hash, nothing else
