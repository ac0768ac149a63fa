"""Uploaded model bundles: a single ``.onnx``, or a tar (plain, gzip, bzip2 or xz) or zip archive
with its external data.

An archive is unpacked by the same rules as a local bundle (``farm.core.names``): regular files
only (no links, devices, FIFOs or sparse files), canonical relative names (no absolute path,
``..``, NUL or backslash, no name both a file and a directory), checked member by member before
anything of it is written. Everything is bounded *while it streams*, never after:

- the bytes decompressed (headers included) stop at the upload cap plus a small allowance, and,
  past ``RATIO_FLOOR``, at ``MAX_RATIO`` times the bytes uploaded: a bomb costs the CPU of the
  cap, not of its expansion;
- the members (``MAX_MEMBERS``), each extended header (``MAX_HEADER``: a pax or GNU long-name
  header is read into memory), each member's declared size and the total written;
- ``cancelled`` (set when the client goes away) stops the work at the next chunk.

Exactly one ``.onnx`` at the archive's top level is the model. Every refusal is
``invalid-model`` with a message naming the limit.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import tarfile
import threading
import zipfile
from pathlib import Path
from typing import IO, Any, Protocol
from zlib import error as zlib_error

from farm.core.archives import MAX_MEMBERS, ZIP_ERRORS, zip_directory
from farm.core.archives import reason as _reason
from farm.core.errors import InvalidModelError
from farm.core.names import UnsafePathError, inside, safe_relative

MAX_HEADER = 1024 * 1024  # a pax / GNU long-name header's data, read whole by tarfile
OVERHEAD = 16 * 1024 * 1024  # tar headers and padding on top of the files' bytes
RATIO_FLOOR = 256 * 1024 * 1024  # expansions up to this are never refused for their ratio
MAX_RATIO = 1024  # beyond the floor: decompressed bytes per uploaded byte (gzip's own limit is ~1032)
CHUNK = 1024 * 1024

ONNX_TYPES = ("application/octet-stream", "application/onnx", "application/x-onnx")
TAR_TYPES = ("application/x-tar", "application/gzip", "application/x-gzip", "application/x-gtar",
             "application/x-compressed-tar", "application/x-bzip2", "application/x-bzip-compressed-tar",
             "application/x-xz", "application/x-xz-compressed-tar")
ZIP_TYPES = ("application/zip", "application/x-zip-compressed")
BOMB_HINT = "raise FARM_MAX_UPLOAD_MB if the model is really that large"


def unpack(upload: Path, content_type: str, dest: Path, *, max_bytes: int,
           cancelled: threading.Event | None = None) -> Path:
    """Lay the upload out in ``dest``; returns the .onnx path. Raises InvalidModelError."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ONNX_TYPES or kind == "":
        target = dest / "model.onnx"
        shutil.copyfile(upload, target)  # its bytes were capped as they came in
        return target
    budget = Budget(max_bytes, upload.stat().st_size, cancelled)
    if kind in TAR_TYPES:
        _untar(upload, dest, budget)
    elif kind in ZIP_TYPES:
        _unzip(upload, dest, budget)
    else:
        raise InvalidModelError(f"unsupported upload type {kind!r}",
                                hint="send a .onnx (application/octet-stream), a tar (application/x-tar; gzip, "
                                     "bzip2 or xz compressed) or a zip (application/zip)")
    models = sorted(p for p in dest.iterdir() if p.is_file() and p.suffix == ".onnx")
    if len(models) != 1:
        raise InvalidModelError(f"the archive must hold exactly one .onnx at its top level, found {len(models)}")
    return models[0]


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class Budget:
    """What an archive may still cost: bytes written (``files``), bytes decompressed
    (``stream``), members; and whether the client is still there."""

    def __init__(self, max_bytes: int, uploaded: int, cancelled: threading.Event | None = None):
        self.files = max_bytes
        self.stream = min(max_bytes + OVERHEAD, max(RATIO_FLOOR, MAX_RATIO * max(uploaded, 1)))
        self.members = MAX_MEMBERS
        self.cancelled = cancelled

    def check(self) -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise InvalidModelError("the upload was abandoned by the client")

    def decompressed(self, n: int) -> None:
        self.check()
        self.stream -= n
        if self.stream < 0:
            raise InvalidModelError("the archive expands past its limit (an archive bomb?): stopped while "
                                    "decompressing", hint=BOMB_HINT)

    def member(self, name: str, declared: int) -> None:
        self.check()
        self.members -= 1
        if self.members < 0:
            raise InvalidModelError(f"the archive has more than {MAX_MEMBERS} members")
        if declared > self.files:
            raise InvalidModelError(f"the archive member {name[:80]!r} declares {declared} bytes, past the upload "
                                    "size limit", hint=BOMB_HINT)

    def written(self, n: int) -> None:
        self.check()
        self.files -= n
        if self.files < 0:
            raise InvalidModelError("the archive expands past the upload size limit (an archive bomb?)",
                                    hint=BOMB_HINT)


class _Names:
    """Member names checked one at a time, as they stream: canonical, unique, and no name both
    a file and a directory (``a`` then ``a/b``, or ``a/b`` then ``a``)."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def add(self, name: str) -> None:
        try:
            parts = safe_relative(name).parts
        except UnsafePathError as exc:
            raise InvalidModelError(f"the archive holds an unsafe name: {exc}") from None
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts))]
        if name in self.files or name in self.dirs or any(p in self.files for p in prefixes):
            raise InvalidModelError(f"the archive holds {name[:80]!r} twice, or as both a file and a directory")
        self.files.add(name)
        self.dirs.update(prefixes)


class _Counted:
    """A read-only stream that charges every byte it returns to the budget."""

    def __init__(self, inner: _Readable, budget: Budget):
        self.inner, self.budget = inner, budget

    def read(self, n: int = -1) -> bytes:
        data = self.inner.read(CHUNK if n is None or n < 0 else min(n, CHUNK))
        self.budget.decompressed(len(data))
        return data


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a pax or GNU long-name header's data whole into memory: bound it first."""

    _EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)

    def _proc_member(self, tarfile_: tarfile.TarFile) -> Any:
        if self.type in self._EXTENDED and self.size > MAX_HEADER:
            raise InvalidModelError(f"the archive has an extended header of {self.size} bytes "
                                    f"(over {MAX_HEADER})")
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _decompressing(raw: IO[bytes]) -> IO[bytes]:
    """The upload's bytes, decompressed lazily by their magic number (tar needs none)."""
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head.startswith(b"BZh"):
        return bz2.BZ2File(raw, mode="rb")
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw, mode="rb")
    return raw


def _copy(src: _Readable, dst: Path, budget: Budget) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as out:
        while chunk := src.read(CHUNK):
            budget.written(len(chunk))
            out.write(chunk)


def _untar(upload: Path, dest: Path, budget: Budget) -> None:
    names = _Names()
    try:
        with open(upload, "rb") as raw, _decompressing(raw) as plain:
            # "r|": one pass over the stream, member by member; nothing is read ahead or twice.
            with tarfile.open(fileobj=_Counted(plain, budget), mode="r|",  # type: ignore[call-overload]
                              tarinfo=_BoundedTarInfo) as tar:
                while (m := tar.next()) is not None:
                    tar.members.clear()  # a stream needs no index of what it passed (pax data included)
                    budget.member(m.name, m.size if m.isfile() else 0)
                    if m.isdir():
                        continue
                    if not m.isfile() or m.issparse():
                        raise InvalidModelError(f"the archive member {m.name[:80]!r} is a link, a sparse or a "
                                                "special file")
                    names.add(m.name)
                    src = tar.extractfile(m)
                    if src is None:
                        raise InvalidModelError(f"cannot read archive member {m.name[:80]!r}")
                    _copy(src, inside(dest, m.name), budget)
    except (tarfile.TarError, EOFError, OSError, UnsafePathError, lzma.LZMAError, zlib_error) as exc:
        raise InvalidModelError(f"not a readable tar archive: {_reason(exc)}",
                                hint="the archive is damaged (cut short, a bad header): make it again") from None


def _zip_directory(upload: Path) -> None:
    """Refuse a zip whose central directory is too big before zipfile parses it (the one
    reader: ``farm.core.archives``)."""
    zip_directory(upload, max_members=MAX_MEMBERS, error=InvalidModelError)


def _unzip(upload: Path, dest: Path, budget: Budget) -> None:
    names = _Names()
    try:
        _zip_directory(upload)
        with zipfile.ZipFile(upload) as zf:
            infos = zf.infolist()  # the central directory: its size is the upload's
            if len(infos) > MAX_MEMBERS:
                raise InvalidModelError(f"the archive has more than {MAX_MEMBERS} members")
            if sum(i.file_size for i in infos) > budget.files:
                raise InvalidModelError("the archive declares more bytes than the upload size limit "
                                        "(an archive bomb?)", hint=BOMB_HINT)
            for i in infos:
                budget.member(i.filename, i.file_size)
                if i.is_dir():
                    continue
                mode = (i.external_attr >> 16) & 0o170000
                if mode and mode != 0o100000:
                    raise InvalidModelError(f"the archive member {i.filename[:80]!r} is a link or a special file")
                if i.flag_bits & 0x1:
                    raise InvalidModelError(f"the archive member {i.filename[:80]!r} is encrypted")
                names.add(i.filename)
                # Headers can lie: what is decompressed is counted as it comes, member by member.
                with zf.open(i) as src:
                    _copy(_Counted(src, budget), inside(dest, i.filename), budget)
    except ZIP_ERRORS + (UnsafePathError,) as exc:
        raise InvalidModelError(f"not a readable zip archive: {_reason(exc)}",
                                hint="the archive is damaged (a bad CRC, cut short): make it again") from None
