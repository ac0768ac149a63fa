"""Checks for what came from outside, before any of it is used (the standard library only: the
device client ships this module in its own wheel).

"Outside" is a server's answer to a device, a manifest read back from a store, a row another
process wrote. Each check accepts one exact shape and raises ``ManifestError`` (``bad-manifest``)
otherwise; nothing here trusts a type, a size or a name it has not looked at.

- a digest is ``sha256:`` and 64 lowercase hex digits, nothing else;
- a size is a non-negative ``int`` (not a bool) up to ``MAX_FILE_BYTES``;
- a file name is a canonical relative POSIX path of ``[A-Za-z0-9_][A-Za-z0-9._+-]*`` components
  (``farm.core.names.safe_relative`` holds the path rule; artifacts use fixed stems, so anything
  more exotic is refused rather than interpreted);
- a manifest is a JSON object with the fields a device reads, each of its type (``check_manifest``).
"""

from __future__ import annotations

import re
from typing import Any

from farm.core.errors import ManifestError
from farm.core.keys import is_digest
from farm.core.names import UnsafePathError, check_tree

MAX_FILE_BYTES = 1 << 40  # 1 TiB: far above any context binary, far below what breaks arithmetic
MAX_FILES = 4096
MAX_NAME = 1024
BACKENDS = ("qnn", "trt")
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")  # + joins the SoCs of a multi-SoC target


def shown(value: Any, limit: int = 80) -> str:
    """A value from outside, safe to put in a message: repr'd (control characters escaped), cut."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def clean_text(value: Any, limit: int = 500) -> str:
    """Text from outside for a terminal: printable characters only (no escape sequences), cut."""
    text = value if isinstance(value, str) else ""
    text = "".join(c if c.isprintable() else " " for c in text[: limit * 2])
    return text if len(text) <= limit else text[:limit] + "..."


def check_digest(value: Any, what: str = "digest") -> str:
    if not isinstance(value, str) or len(value) != 71 or not is_digest(value):
        raise ManifestError(f"{what} {shown(value)} is not a sha256 digest (sha256: and 64 lowercase hex digits)")
    return value


def check_size(value: Any, what: str = "size", *, limit: int = MAX_FILE_BYTES) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ManifestError(f"{what} {shown(value)} is not a whole number of bytes between 0 and {limit}")
    return value


def check_file_name(value: Any) -> str:
    """A file name from a manifest: canonical, relative, fixed characters (see the module doc)."""
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ManifestError(f"file name {shown(value)} is empty, too long or not text")
    if not all(_COMPONENT.fullmatch(part) for part in value.split("/")):
        raise ManifestError(f"file name {shown(value)} is not a plain relative path "
                            "([A-Za-z0-9_][A-Za-z0-9._+-]* components joined by '/')")
    return value


def check_version(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _VERSION.fullmatch(value):
        raise ManifestError(f"{what} {shown(value)} is not a version")
    return value


def check_target_name(value: Any, what: str = "target") -> str:
    if not isinstance(value, str) or not _TARGET.fullmatch(value):
        raise ManifestError(f"{what} {shown(value)} is not a target name")
    return value


def check_manifest(manifest: Any) -> dict[str, Any]:
    """The shape and safety of an artifact manifest, before any of it is trusted: the fields a
    device or a fetch reads, each of its type; every file digest, size and name checked; no name
    twice or both a file and a directory; ``ctxModel`` one of the files. Raises ManifestError."""
    def bad(why: str) -> ManifestError:
        return ManifestError(f"manifest is not valid: {why}")

    if not isinstance(manifest, dict):
        raise bad("not a JSON object")
    for key, kind in (("model", str), ("backend", str), ("ctxModel", str), ("files", list), ("target", dict),
                      ("toolchain", dict)):
        if not isinstance(manifest.get(key), kind):
            raise bad(f"{key!r} is missing or not a {kind.__name__}")
    if not is_digest(manifest["model"]):
        raise bad("'model' is not a sha256 digest")
    if manifest["backend"] not in BACKENDS:
        raise bad(f"'backend' {shown(manifest['backend'])} is not one of {', '.join(BACKENDS)}")
    if not isinstance(manifest["target"].get("name"), str) or not isinstance(manifest["toolchain"].get("version"), str):
        raise bad("'target.name' or 'toolchain.version' is missing")
    check_target_name(manifest["target"]["name"], "'target.name'")
    check_version(manifest["toolchain"]["version"], "'toolchain.version'")
    if "options" in manifest and not isinstance(manifest["options"], dict):
        raise bad("'options' is not an object")
    files = manifest["files"]
    if not files or len(files) > MAX_FILES:
        raise bad(f"'files' lists {len(files)} files (1 to {MAX_FILES})")
    names = []
    for f in files:
        if not isinstance(f, dict):
            raise bad("a file entry is not an object")
        try:
            check_file_name(f.get("name"))
            check_digest(f.get("digest"), f"file {shown(f.get('name'))}: digest")
            check_size(f.get("size"), f"file {shown(f.get('name'))}: size")
        except ManifestError as exc:
            raise bad(exc.message) from None
        names.append(f["name"])
    try:
        check_tree(names)
    except UnsafePathError as exc:
        raise ManifestError(f"manifest lists an unsafe file name: {exc}") from None
    if manifest["ctxModel"] not in names:
        raise bad("'ctxModel' is not one of its files")
    return manifest


_ROLE = re.compile(r"[a-z][a-z0-9_]{0,31}(?:\.[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?")


def manifest_stages(manifest: dict[str, Any]) -> list[dict[str, str]]:
    """What each file of a checked manifest is, for ``--json`` on a device: a genai package's
    stages (``genai.stages``: file and role, ``part0.prefill``, ``embeddings``...) or a graph
    group's graphs (their context model and graph name); [] for a single context. Every file
    must be one the manifest lists and every role a plain dotted name, else ``bad-manifest``."""
    names = {f["name"] for f in manifest["files"]}
    raw: list[tuple[Any, Any]] = []
    genai = manifest.get("genai")
    if isinstance(genai, dict) and isinstance(genai.get("stages"), list):
        raw = [(s.get("file"), s.get("role")) if isinstance(s, dict) else (None, None) for s in genai["stages"]]
    elif isinstance(manifest.get("graphs"), list):
        raw = [(g.get("ctxModel"), g.get("name")) if isinstance(g, dict) else (None, None)
               for g in manifest["graphs"]]
    out = []
    for file, role in raw[:MAX_FILES]:
        if not isinstance(file, str) or file not in names or not isinstance(role, str) or not _ROLE.fullmatch(role):
            raise ManifestError(f"manifest is not valid: a stage {shown(file)} / {shown(role)} is not one of its "
                                "files with a plain role")
        out.append({"file": file, "role": role})
    return out
