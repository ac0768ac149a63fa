"""Artifact manifests: canonical JSON, stored as a content-addressed blob (like an OCI manifest).

The manifest digest is the artifact's identity; signatures are made over it.
"""

from __future__ import annotations

from typing import Any

from farm.core.errors import DigestMismatchError
from farm.core.keys import canonical_json, sha256_bytes

MEDIA_MANIFEST = "application/vnd.ctxfarm.manifest.v1+json"
SCHEMA_VERSION = 1


def make_manifest(
    *,
    model_digest: str,
    build_key: str,
    backend: str,
    target: dict[str, Any],
    toolchain: dict[str, Any],
    options: dict[str, Any],
    options_digest: str,
    ctx_model: str,
    files: list[dict[str, Any]],
    epcontext: list[dict[str, Any]],
    placement: dict[str, Any],
    compile_seconds: float,
    built_at: str,
    log: dict[str, Any] | None,
    graphs: list[dict[str, Any]] | None = None,
    description: dict[str, Any] | None = None,
    compatibility: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``graphs``: a graph group's graphs in order (name, source model digest, its context model
    and the binaries it uses); ``description``: what the context binaries say about themselves
    (QNN System API), checked against the request; ``compatibility``: the EP's own compatibility
    string by EP name (``{"QNNExecutionProvider": "v2:6:2.51.0:..."}``, the context model's
    ``ep_compatibility_info.<EP>``; {} where the EP wrote none). Each key is present only when given."""
    extra: dict[str, Any] = {}
    if graphs is not None:
        extra["graphs"] = graphs
    if description is not None:
        extra["description"] = description
    if compatibility is not None:
        extra["compatibility"] = dict(sorted(compatibility.items()))
    return {
        **extra,
        "schemaVersion": SCHEMA_VERSION,
        "mediaType": MEDIA_MANIFEST,
        "model": model_digest,
        "buildKey": build_key,
        "backend": backend,
        "target": target,
        "toolchain": toolchain,
        "options": options,
        "optionsDigest": options_digest,
        "ctxModel": ctx_model,
        "files": sorted(files, key=lambda f: f["name"]),
        "epcontext": epcontext,
        "placement": placement,
        "compileSeconds": round(compile_seconds, 6),
        "builtAt": built_at,
        "log": log,
    }


def encode(manifest: dict[str, Any]) -> tuple[bytes, str]:
    data = canonical_json(manifest)
    return data, sha256_bytes(data)


def decode(data: bytes, digest: str) -> dict[str, Any]:
    import json

    if sha256_bytes(data) != digest:
        raise DigestMismatchError(f"manifest {digest} does not match its content (tampered or corrupt)")
    manifest: dict[str, Any] = json.loads(data)
    return manifest


def cpu_op_types(store: Any, digest: str) -> list[str]:
    """The op types an artifact left on the CPU, from its manifest's placement (read from
    ``store``, a BlobStore); empty when the manifest cannot be read."""
    from farm.core.errors import FarmError
    from registry.store.base import read_bytes

    try:
        return list(decode(read_bytes(store, digest), digest)["placement"]["cpu_op_types"])
    except (FarmError, KeyError, TypeError, ValueError):
        return []
