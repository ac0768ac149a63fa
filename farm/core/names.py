"""The one name grammar, and the one safe-relative-path rule.

Model names and tags follow the OCI distribution spec: a name is lowercase alphanumeric
components separated by ``.``, ``_``, ``__`` or ``-``, with optional ``/`` namespaces, at most
255 characters; a tag is ``[A-Za-z0-9_][A-Za-z0-9._-]{0,127}``. They are checked at every entry
(CLI, Celery message, HTTP) and never become file names: artifacts use fixed file stems.

A relative path from a manifest or from a model's external-data location is accepted only in
canonical POSIX form (see ``safe_relative``), and a path written under a root is checked to stay
there after resolution (``inside``).
"""

from __future__ import annotations

import re
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


def inside(root: Path, rel: str) -> Path:
    """``root/rel`` for a safe relative ``rel``, checked to stay under ``root`` after symlinks
    are resolved. Raises UnsafePathError."""
    pure = safe_relative(rel)
    base = root.resolve()
    target = (base / pure).resolve()
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
