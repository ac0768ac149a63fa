"""The one zip reader for what comes in from outside: uploaded model bundles (``farm.api.uploads``)
and sample inputs (``.npz``, ``registry.evidence``), on the service and in the CLI alike.

Before ``zipfile`` parses the central directory into objects (a few hundred bytes of memory per
46-byte entry: 250,000 entries cost 136 MiB), the end-of-directory records are read and an archive
with more entries than its cap, or a directory past ``MAX_DIRECTORY``, is refused. Every library
failure while reading (a bad CRC, a truncated member, a bad header, an unsupported compression)
becomes the caller's error class (``invalid-model``, ``bad-samples``) with a hint, never an
``internal-error``.
"""

from __future__ import annotations

import lzma
import struct
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from zlib import error as zlib_error

from farm.core.errors import FarmError

MAX_MEMBERS = 4096
MAX_DIRECTORY = 8 * 1024 * 1024  # a central directory of MAX_MEMBERS entries with long names fits
# What reading a zip may raise when it is damaged: each becomes the caller's documented error.
ZIP_ERRORS: tuple[type[BaseException], ...] = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError,
                                               NotImplementedError, lzma.LZMAError, zlib_error, struct.error,
                                               UnicodeDecodeError)


def zip_directory(path: Path, *, max_members: int, error: type[FarmError], hint: str | None = None) -> None:
    """Refuse a zip whose central directory is too big *before* zipfile parses it: its entry
    count and size, read from the end-of-directory records (zip64's too)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - (65535 + 22 + 20)))
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < 22:
            return  # not a zip: zipfile says so
        entries, cd_size = struct.unpack("<HI", tail[at + 10:at + 16])
        if (entries == 0xFFFF or cd_size == 0xFFFFFFFF) and at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
            (zip64_at,) = struct.unpack("<Q", tail[at - 12:at - 4])  # the locator: PK\6\7, disk, offset
            if zip64_at + 56 <= size:
                f.seek(zip64_at)
                record = f.read(56)
                if record[:4] == b"PK\x06\x06":
                    entries, cd_size = struct.unpack("<QQ", record[32:48])
    if entries > max_members:
        raise error(f"the archive has more than {max_members} members", hint=hint)
    if cd_size > MAX_DIRECTORY:
        raise error(f"the archive's directory is {cd_size} bytes (over {MAX_DIRECTORY})", hint=hint)


@contextmanager
def open_zip(path: Path, *, max_members: int, error: type[FarmError], what: str = "zip archive",
             hint: str | None = None) -> Iterator[zipfile.ZipFile]:
    """``path`` as a ZipFile whose directory was bounded first; any damage found while the
    caller reads it (inside the ``with``) is ``error`` naming the reason."""
    try:
        zip_directory(path, max_members=max_members, error=error, hint=hint)
        with zipfile.ZipFile(path) as zf:
            if len(zf.infolist()) > max_members:
                raise error(f"the archive has more than {max_members} members", hint=hint)
            yield zf
    except ZIP_ERRORS as exc:
        raise error(f"not a readable {what}: {reason(exc)}", hint=hint) from None


def reason(exc: BaseException) -> str:
    """Why a library refused the archive, without any path of this host (an OSError names one)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:200]
    return str(exc)[:200] or type(exc).__name__
