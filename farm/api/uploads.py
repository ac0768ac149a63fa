"""Uploaded model bundles: a single ``.onnx``, or a tar/zip archive with its external data.

An archive is unpacked by the same rules as a local bundle (``farm.core.names``): regular files
only (no links, devices or FIFOs), canonical relative names (no absolute path, ``..``, NUL or
backslash), a bounded number of members and a bounded expansion (a zip bomb stops at the cap,
whatever its headers claim). Exactly one ``.onnx`` at the archive's top level is the model.
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import IO

from farm.core.errors import InvalidModelError
from farm.core.names import UnsafePathError, check_tree, inside

MAX_MEMBERS = 4096
CHUNK = 1024 * 1024

ONNX_TYPES = ("application/octet-stream", "application/onnx", "application/x-onnx")
TAR_TYPES = ("application/x-tar", "application/gzip", "application/x-gzip", "application/x-gtar")
ZIP_TYPES = ("application/zip", "application/x-zip-compressed")


def unpack(upload: Path, content_type: str, dest: Path, *, max_bytes: int) -> Path:
    """Lay the upload out in ``dest``; returns the .onnx path. Raises InvalidModelError."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ONNX_TYPES or kind == "":
        target = dest / "model.onnx"
        shutil.copyfile(upload, target)
        return target
    if kind in TAR_TYPES:
        _untar(upload, dest, max_bytes)
    elif kind in ZIP_TYPES:
        _unzip(upload, dest, max_bytes)
    else:
        raise InvalidModelError(f"unsupported upload type {kind!r}",
                                hint="send a .onnx (application/octet-stream), a tar (application/x-tar, "
                                     "gzip allowed) or a zip (application/zip)")
    models = sorted(p for p in dest.iterdir() if p.is_file() and p.suffix == ".onnx")
    if len(models) != 1:
        raise InvalidModelError(f"the archive must hold exactly one .onnx at its top level, found {len(models)}")
    return models[0]


def _check_names(names: list[str]) -> None:
    if len(names) > MAX_MEMBERS:
        raise InvalidModelError(f"the archive has more than {MAX_MEMBERS} members")
    try:
        check_tree([n.rstrip("/") for n in names])
    except UnsafePathError as exc:
        raise InvalidModelError(f"the archive holds an unsafe name: {exc}") from None


def _copy_capped(src: IO[bytes], dst: Path, budget: list[int]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as out:
        while chunk := src.read(CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise InvalidModelError("the archive expands past the upload size limit (a zip bomb?)",
                                        hint="raise FARM_MAX_UPLOAD_MB if the model is really that large")
            out.write(chunk)


def _untar(upload: Path, dest: Path, max_bytes: int) -> None:
    budget = [max_bytes]
    try:
        with tarfile.open(upload, "r:*") as tar:
            members = tar.getmembers()
            files = []
            for m in members:
                if m.isdir():
                    continue
                if not m.isfile():
                    raise InvalidModelError(f"the archive member {m.name[:80]!r} is a link or a special file")
                files.append(m)
            _check_names([m.name for m in files])
            for m in files:
                src = tar.extractfile(m)
                if src is None:
                    raise InvalidModelError(f"cannot read archive member {m.name[:80]!r}")
                _copy_capped(src, inside(dest, m.name), budget)
    except (tarfile.TarError, EOFError, OSError, UnsafePathError) as exc:
        raise InvalidModelError(f"not a readable tar archive: {str(exc)[:200]}") from None


def _unzip(upload: Path, dest: Path, max_bytes: int) -> None:
    budget = [max_bytes]
    try:
        with zipfile.ZipFile(upload) as zf:
            infos = [i for i in zf.infolist() if not i.is_dir()]
            for i in infos:
                mode = (i.external_attr >> 16) & 0o170000
                if mode and mode != 0o100000:
                    raise InvalidModelError(f"the archive member {i.filename[:80]!r} is a link or a special file")
            _check_names([i.filename for i in infos])
            for i in infos:
                with zf.open(i) as src:
                    _copy_capped(src, inside(dest, i.filename), budget)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, UnsafePathError, NotImplementedError) as exc:
        raise InvalidModelError(f"not a readable zip archive: {str(exc)[:200]}") from None

