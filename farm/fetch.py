"""Device-side fetch: resolve, download every file, verify every digest, lay the files out so the
context model's relative ``ep_cache_context`` paths resolve."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from farm.errors import DigestMismatchError, StorageError
from registry import manifest as mf
from registry.models import Artifact
from registry.store.base import BlobStore, download, read_bytes

PAYLOAD_ROLES = ("ctx-model", "context")


@dataclass
class FetchResult:
    artifact: str
    ctx_model: Path
    files: list[Path]
    bytes: int
    signed_by: str | None = None


def fetch_artifact(store: BlobStore, artifact: Artifact, out_dir: Path, *, name: str | None = None,
                   signatures: list[tuple[str, str]] | None = None, trusted: list[str] | None = None,
                   require_signature: bool = False) -> FetchResult:
    """Download ``artifact`` into ``out_dir``. The signature (when trusted keys are configured or
    one is required) is checked over the manifest digest, the manifest against its digest and
    the index, each file against the manifest. Nothing half-written is left behind."""
    signed_by = None
    if require_signature or trusted:
        from registry.signing import check

        signed_by = check(artifact.digest, signatures or [], trusted or [], required=require_signature)
    manifest = mf.decode(read_bytes(store, artifact.digest), artifact.digest)
    listed = {f["name"]: f for f in manifest["files"]}
    indexed = {f.name: f for f in artifact.files if f.role in PAYLOAD_ROLES}
    if set(listed) != set(indexed) or any(listed[n]["digest"] != indexed[n].digest for n in listed):
        raise DigestMismatchError(
            f"artifact {artifact.short_id}: the index and the manifest disagree on its files",
            hint="run `farm registry verify --repair`",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx_name = manifest["ctxModel"]
    final_ctx = f"{name}_ctx.onnx" if name else ctx_name
    # Everything lands in a staging dir first and is moved in only when every file verified:
    # a failed fetch leaves the device's directory as it was.
    staging = Path(tempfile.mkdtemp(prefix=".ctxfarm-fetch-", dir=out_dir))
    placed: list[tuple[Path, Path]] = []
    total = 0
    try:
        for fname, entry in sorted(listed.items()):
            rel = PurePosixPath(fname)
            if rel.is_absolute() or ".." in rel.parts:
                raise StorageError(f"manifest lists an unsafe path {fname!r}")
            # Renaming the top-level context model is safe: it references its .bin files relatively.
            rel_out = final_ctx if fname == ctx_name else str(rel)
            download(store, entry["digest"], staging / rel_out, size=int(entry["size"]))
            placed.append((staging / rel_out, out_dir / rel_out))
            total += int(entry["size"])
        for src, dest in placed:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    written = [dest for _, dest in placed]
    return FetchResult(artifact.digest, out_dir / final_ctx, written, total, signed_by)


def receipt(result: FetchResult, extra: dict[str, Any]) -> dict[str, Any]:
    return {"artifact": result.artifact, "ctx_model": os.fspath(result.ctx_model),
            "files": [os.fspath(p) for p in result.files], "bytes": result.bytes, "signed_by": result.signed_by,
            **extra}
