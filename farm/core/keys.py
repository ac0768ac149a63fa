"""Digests and build keys.

- model digest: sha256 over the bundle listing (the .onnx bytes and each external-data file by
  sorted relative path), so the same bundle has the same digest wherever it lives and whatever
  the top-level file is called;
- options digest: sha256 of the normalized options as canonical JSON;
- build key: sha256 of (model digest, backend, target, toolchain version, options digest).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1024 * 1024
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def sha256_stream(stream: BinaryIO) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        h.update(chunk)
        size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def sha256_file(path: Path) -> tuple[str, int]:
    with open(path, "rb") as f:
        return sha256_stream(f)


def is_digest(value: str) -> bool:
    return bool(DIGEST_RE.fullmatch(value))


def bundle_digest(onnx_digest: str, external: Iterable[tuple[str, str]]) -> str:
    """Digest of a model bundle: the .onnx digest plus (relative path, digest) of each data file."""
    listing = {"onnx": onnx_digest, "external": sorted([p, d] for p, d in external)}
    return sha256_bytes(b"ctxfarm-bundle-v1\n" + canonical_json(listing))


def options_digest(normalized: dict[str, Any]) -> str:
    return sha256_bytes(canonical_json(normalized))


def build_key(model_digest: str, backend: str, target: str, toolchain: str, opts_digest: str) -> str:
    """The identity of a build; UNIQUE in the index. Hex only (64 chars)."""
    payload = canonical_json(
        {
            "model": model_digest,
            "backend": backend,
            "target": target,
            "toolchain": toolchain,
            "options": opts_digest,
        }
    )
    return hashlib.sha256(b"ctxfarm-build-v1\n" + payload).hexdigest()


@lru_cache(maxsize=4096)
def parse_version(v: str) -> tuple[int, ...]:
    """'2.49.40' -> (2, 49, 40); non-numeric parts compare as 0. Cached: resolve ranks every
    candidate by it, and a registry holds few distinct versions."""
    out = []
    for part in v.split("."):
        m = re.match(r"\d+", part)
        out.append(int(m.group()) if m else 0)
    while len(out) > 1 and out[-1] == 0:  # "2.51" == "2.51.0"
        out.pop()
    return tuple(out)
