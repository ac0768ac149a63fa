"""The one name grammar, and the one safe-relative-path rule.

Model names and tags follow the OCI distribution spec: a name is lowercase alphanumeric
components separated by ``.``, ``_``, ``__`` or ``-``, with optional ``/`` namespaces, at most
255 characters; a tag is ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``. They are checked at every entry
(CLI, Celery message, HTTP) and never become file names: artifacts use fixed file stems.

A relative path from a manifest or from a model's external-data location is accepted only in
canonical POSIX form (see ``safe_relative``), and a path written under a root is checked to stay
there after resolution (``inside``).

A path given to the farm to read (a model, an export folder and its files) is resolved and
stat'ed here too (``resolve``, ``input_file``, ``input_folder``): every way the filesystem can
refuse it (a symlink loop, a dangling symlink, permission denied, a name the OS refuses, a FIFO
or device where a file belongs) is an ``UnusablePathError`` saying which, never an exception a
front door does not know. The callers turn it into their input code (``invalid-model``,
``bad-genai``) naming the file.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path, PurePosixPath

from farm.core.errors import BadNameError

_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
NAME_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
NAME_MAX = 255
DEFAULT_TAG = "latest"


def check_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > NAME_MAX or not NAME_RE.fullmatch(name):
        shown = name if isinstance(name, str) and len(name) <= 80 else f"{str(name)[:80]}..."
        raise BadNameError(f"model name {shown!r} is not allowed")
    return name


def check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not TAG_RE.fullmatch(tag):
        shown = tag if isinstance(tag, str) and len(tag) <= 80 else f"{str(tag)[:80]}..."
        raise BadNameError(f"tag {shown!r} is not allowed")
    return tag


def split_ref(ref: str) -> tuple[str, str]:
    """``NAME[:TAG]`` -> (name, tag), both checked; the tag defaults to ``latest``."""
    name, sep, tag = ref.rpartition(":") if ":" in ref else (ref, "", DEFAULT_TAG)
    if sep and not tag:
        raise BadNameError(f"model reference {ref[:80]!r} has an empty tag")
    return check_name(name), check_tag(tag)


class UnsafePathError(ValueError):
    """A relative path that is not canonical, or leaves its root."""


def safe_relative(rel: str) -> PurePosixPath:
    """Accept only a canonical relative POSIX path: no empty string, NUL, backslash, absolute
    path, drive, ``.`` or ``..`` component, empty component or trailing slash."""
    if not isinstance(rel, str) or not rel:
        raise UnsafePathError("empty path")
    if "\x00" in rel or "\\" in rel:
        raise UnsafePathError(f"{rel!r} contains a NUL or a backslash")
    if len(rel) > 1024 or any(ord(c) < 32 for c in rel):
        raise UnsafePathError(f"{rel[:80]!r} is too long or has control characters")
    if rel.startswith("/") or (len(rel) > 1 and rel[1] == ":"):
        raise UnsafePathError(f"{rel!r} is absolute")
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"{rel!r} is not a canonical relative path")
    if any(len(p.encode()) > 255 for p in parts):
        raise UnsafePathError(f"{rel[:80]!r} has a component over 255 bytes")
    return PurePosixPath(rel)


def canonical_relative(rel: str) -> PurePosixPath:
    """Like ``safe_relative`` but first drops harmless ``./`` components (ONNX writers produce
    ``./weights.bin``): the canonical form is what the digest covers."""
    if isinstance(rel, str) and rel and "\\" not in rel and "\x00" not in rel:
        parts = [p for p in rel.split("/") if p != "."]
        if parts and not rel.startswith("/"):
            rel = "/".join(parts)
    return safe_relative(rel)


class UnusablePathError(UnsafePathError):
    """A path the filesystem refuses as what it was asked for: ``reason`` says how in a few
    words (a symlink loop, a dangling symlink, permission denied, a name the OS refuses, a FIFO
    instead of a file...); ``missing``: nothing at all is there (a caller words that its own way)."""

    def __init__(self, path: Path | str, reason: str, *, missing: bool = False):
        super().__init__(f"{_shown(path)}: {reason}")
        self.reason, self.missing = reason, missing


# What the OS said, in words a user acts on (strerror is terse: "Too many levels of symbolic links").
_WHY = {errno.ELOOP: "a symlink loop", errno.ENAMETOOLONG: "a name longer than the OS allows",
        errno.EACCES: "permission denied", errno.EPERM: "permission denied",
        errno.ENOTDIR: "a component of the path is not a folder", errno.ENOENT: "missing"}


def why(exc: BaseException) -> str:
    """An ``OSError``, ``RuntimeError`` (Python 3.11's symlink loop) or ``ValueError`` (a NUL, an
    unencodable name) from resolving or opening a path, as a few words."""
    if isinstance(exc, OSError):
        return _WHY.get(exc.errno or 0) or (exc.strerror or type(exc).__name__).lower()
    if isinstance(exc, RuntimeError) and "loop" in str(exc).lower():
        return "a symlink loop"
    return f"a name the OS refuses ({str(exc)[:80] or type(exc).__name__})"


def _shown(path: Path | str) -> str:
    s = str(path)
    return repr(s if len(s) <= 120 else f"{s[:60]}...{s[-40:]}")


def resolve(path: Path) -> Path:
    """``path.resolve()``; what the OS refuses on the way is an ``UnusablePathError``."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError) as exc:
        raise UnusablePathError(path, f"cannot be resolved: {why(exc)}") from None


def input_file(path: Path) -> os.stat_result:
    """The stat of a file the farm is given to read, after proving it one: it exists (a
    dangling symlink and a loop are told apart), it is a regular file (not a folder, FIFO,
    device or socket: a FIFO would block the read, a device never end), and it opens for
    reading. Raises ``UnusablePathError`` saying which."""
    st = _stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnusablePathError(path, f"{_kind(st.st_mode)}, not a regular file")
    try:  # stat needs no read permission: opening proves it (a regular file: nothing blocks)
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_NOCTTY", 0)))
    except OSError as exc:
        raise UnusablePathError(path, why(exc)) from None
    return st


def input_folder(path: Path) -> Path:
    """A folder the farm is given to read, resolved (symlinks followed) after proving it one.
    Raises ``UnusablePathError`` saying why not (missing, a loop, a file...)."""
    st = _stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnusablePathError(path, f"{_kind(st.st_mode)}, not a folder")
    return resolve(path)


def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except (OSError, ValueError) as exc:
        if isinstance(exc, FileNotFoundError | NotADirectoryError):
            if _is_link(path):
                raise UnusablePathError(path, "a dangling symlink") from None
            raise UnusablePathError(path, "missing", missing=True) from None
        raise UnusablePathError(path, why(exc)) from None


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a special file"


def inside(root: Path, rel: str) -> Path:
    """``root/rel`` for a safe relative ``rel``, checked to stay under ``root`` after symlinks
    are resolved. Raises UnsafePathError (``UnusablePathError`` when the OS can't resolve it: a
    symlink loop, a name it refuses)."""
    pure = safe_relative(rel)
    base = resolve(root)
    target = resolve(base / pure)
    if target != base and base not in target.parents:
        raise UnsafePathError(f"{rel!r} leaves its directory")
    return base / pure


def check_tree(names: list[str]) -> None:
    """A set of relative file names that can all exist at once: no name is also a directory
    of another (``a`` and ``a/b``), no duplicates."""
    seen: set[str] = set()
    for n in names:
        safe_relative(n)
        if n in seen:
            raise UnsafePathError(f"{n!r} is listed twice")
        seen.add(n)
    for n in names:
        parts = n.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise UnsafePathError(f"{'/'.join(parts[:i])!r} is both a file and a directory")
