"""Device-side install: verify, bind, download, and swap into place atomically.

Before anything is written:
- the signature policy: with trusted keys configured (or a signature required), an artifact
  must carry a signature by a trusted key that verifies over its manifest digest; unsigned is
  refused unless explicitly allowed (deleting a signature row can't downgrade the check);
- the manifest is read by digest, its shape validated (``bad-manifest``), and bound to the
  request: its model digest, backend, target and toolchain must equal what was resolved, so a
  re-pointed index row can't serve another model's (signed) artifact;
- every file name passes the one safe-relative-path rule, and no name is both a file and a
  directory; the destination must be a directory or absent (``install-conflict``).

Then every file streams into a sibling staging directory (each verified by size and sha256)
which is swapped with ``--out`` atomically (``farm.core.placement``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.errors import DigestMismatchError, ManifestError, SignatureError, UnsignedError
from farm.core.names import inside, safe_relative
from farm.core.placement import destination, staged
from farm.core.untrusted import check_manifest, manifest_stages
from registry import manifest as mf
from registry.models import Artifact
from registry.store.base import BlobStore, download, read_bytes

PAYLOAD_ROLES = ("ctx-model", "context")


@dataclass(frozen=True)
class Expected:
    """What the request resolved to; the manifest must say the same."""

    model_digest: str
    backend: str
    target: str
    toolchain: str


@dataclass
class FetchResult:
    artifact: str
    ctx_model: Path
    files: list[Path]
    bytes: int
    signed_by: str | None = None
    stages: list[dict[str, str]] = field(default_factory=list)  # each file's role (a group, a genai package)


def validate_manifest(manifest: Any) -> dict[str, Any]:
    """Shape and safety of a manifest, before any of it is trusted (the device client runs the
    same checks: ``farm.core.untrusted.check_manifest``). Raises ManifestError."""
    return check_manifest(manifest)


def check_binding(manifest: dict[str, Any], expected: Expected) -> None:
    got = Expected(manifest["model"], manifest["backend"], manifest["target"]["name"],
                   manifest["toolchain"]["version"])
    if got != expected:
        diffs = [f"{k}: manifest {getattr(got, k)!r} != requested {getattr(expected, k)!r}"
                 for k in ("model_digest", "backend", "target", "toolchain") if getattr(got, k) != getattr(expected, k)]
        raise SignatureError("the artifact's manifest is not for what was requested (" + "; ".join(diffs) + ")",
                             hint="the index points at another artifact: run `farm registry verify` and do not "
                                  "install it")


def check_signature(digest: str, signatures: list[tuple[str, str]], trusted: list[str], *, required: bool,
                    allow_unsigned: bool) -> str | None:
    from registry.signing import check

    if not trusted and not required:
        return None
    if not signatures and trusted and not required and not allow_unsigned:
        raise UnsignedError(f"artifact {digest} carries no signature, and FARM_TRUSTED_KEYS is set",
                            hint="sign it (farm keys sign ARTIFACT), or allow unsigned artifacts explicitly "
                                 "(FARM_ALLOW_UNSIGNED=1 / --allow-unsigned)")
    return check(digest, signatures, trusted, required=required)


def read_manifest(store: BlobStore, artifact: Artifact) -> dict[str, Any]:
    data = read_bytes(store, artifact.digest)
    try:
        parsed = mf.decode(data, artifact.digest)
    except ValueError:  # JSON and UTF-8 errors; a digest mismatch is its own error
        raise ManifestError(f"manifest {artifact.digest} is not JSON") from None
    manifest = validate_manifest(parsed)
    listed = {f["name"]: f for f in manifest["files"]}
    indexed = {f.name: f for f in artifact.files if f.role in PAYLOAD_ROLES}
    if set(listed) != set(indexed) or any(listed[n]["digest"] != indexed[n].digest for n in listed):
        raise DigestMismatchError(
            f"artifact {artifact.short_id}: the index and the manifest disagree on its files",
            hint="run `farm registry verify --repair`",
        )
    return manifest


def download_artifact(store: BlobStore, artifact: Artifact, dest: Path) -> Path:
    """Download into a fresh private directory (probes); returns the context model's path."""
    manifest = read_manifest(store, artifact)
    for f in manifest["files"]:
        download(store, f["digest"], inside(dest, f["name"]), size=int(f["size"]))
    return inside(dest, manifest["ctxModel"])


def fetch_artifact(store: BlobStore, artifact: Artifact, out_dir: Path, *, expected: Expected | None = None,
                   signatures: list[tuple[str, str]] | None = None, trusted: list[str] | None = None,
                   require_signature: bool = False, allow_unsigned: bool = False) -> FetchResult:
    """Install ``artifact`` into ``out_dir`` atomically (see the module docstring)."""
    signed_by = check_signature(artifact.digest, signatures or [], trusted or [], required=require_signature,
                                allow_unsigned=allow_unsigned)
    manifest = read_manifest(store, artifact)
    check_binding(manifest, expected or Expected(artifact.model_digest, artifact.backend, artifact.target,
                                                 artifact.toolchain))
    stages = manifest_stages(manifest)
    out = destination(out_dir)
    total = 0
    written = []
    with staged(out) as staging:
        for f in sorted(manifest["files"], key=lambda f: f["name"]):
            download(store, f["digest"], inside(staging, f["name"]), size=int(f["size"]))
            written.append(out / safe_relative(f["name"]))
            total += int(f["size"])
    return FetchResult(artifact.digest, out / safe_relative(manifest["ctxModel"]), written, total, signed_by, stages)


def receipt(result: FetchResult, extra: dict[str, Any]) -> dict[str, Any]:
    return {"artifact": result.artifact, "ctx_model": os.fspath(result.ctx_model),
            "files": [os.fspath(p) for p in result.files], "bytes": result.bytes, "signed_by": result.signed_by,
            "stages": result.stages, **extra}
