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
and the staging directory is swapped with ``--out`` in one ``renameat2(RENAME_EXCHANGE)``, so
``--out`` holds either its previous content or the complete new artifact. A killed install
leaves only a ``.<out>.ctxfarm-*`` sibling, removed by the next install into the same place.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.errors import DigestMismatchError, InstallConflictError, ManifestError, SignatureError, UnsignedError
from farm.core.keys import is_digest
from farm.core.names import UnsafePathError, check_tree, inside, safe_relative
from registry import manifest as mf
from registry.models import Artifact
from registry.store.base import BlobStore, download, read_bytes

PAYLOAD_ROLES = ("ctx-model", "context")
STAGING_MARK = ".ctxfarm-"
STALE_STAGING_S = 0.0  # under the install lock, any leftover staging dir is from a dead install


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


def validate_manifest(manifest: Any) -> dict[str, Any]:
    """Shape and safety of a manifest, before any of it is trusted. Raises ManifestError."""
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
    if not isinstance(manifest["target"].get("name"), str) or not isinstance(manifest["toolchain"].get("version"), str):
        raise bad("'target.name' or 'toolchain.version' is missing")
    if not manifest["files"]:
        raise bad("'files' is empty")
    names = []
    for f in manifest["files"]:
        if not isinstance(f, dict):
            raise bad("a file entry is not an object")
        name, digest, size = f.get("name"), f.get("digest"), f.get("size")
        if not isinstance(name, str) or not isinstance(digest, str) or not is_digest(digest):
            raise bad(f"file entry {str(name)[:80]!r} has no valid name or digest")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 1 << 50:
            raise bad(f"file {name[:80]!r} has a size that is not a non-negative integer")
        names.append(name)
    try:
        check_tree(names)
    except UnsafePathError as exc:
        raise ManifestError(f"manifest lists an unsafe file name: {exc}") from None
    if manifest["ctxModel"] not in names:
        raise bad("'ctxModel' is not one of its files")
    return manifest


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
    out = _destination(out_dir)
    with _install_lock(out):
        _clean_leftovers(out)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}{STAGING_MARK}new-", dir=out.parent))
        try:
            total = 0
            written = []
            for f in sorted(manifest["files"], key=lambda f: f["name"]):
                path = inside(staging, f["name"])
                download(store, f["digest"], path, size=int(f["size"]))
                written.append(out / safe_relative(f["name"]))
                total += int(f["size"])
            os.chmod(staging, 0o755 & ~_umask())
            _swap_into_place(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return FetchResult(artifact.digest, out / safe_relative(manifest["ctxModel"]), written, total, signed_by)


def _destination(out_dir: Path) -> Path:
    try:
        out = Path(os.path.abspath(out_dir))
        if out.is_symlink():
            out = out.resolve()
        if out.exists() and not out.is_dir():
            raise InstallConflictError(f"{out_dir} exists and is not a directory: nothing was changed")
        if out.parent == out:
            raise InstallConflictError("refusing to install into the root directory")
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallConflictError(f"cannot install into {out_dir}: {exc.strerror or exc}") from None
    return out


@contextmanager
def _install_lock(out: Path) -> Iterator[None]:
    import fcntl

    lock = out.parent / f".{out.name}{STAGING_MARK}lock"
    with open(lock, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clean_leftovers(out: Path) -> None:
    """Staging dirs of installs that were killed (we hold the lock: nobody else is writing)."""
    prefix = f".{out.name}{STAGING_MARK}"
    for p in out.parent.iterdir():
        if p.name.startswith(prefix) and not p.name.endswith("lock") and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
    # Older ctxfarm staged inside --out itself.
    if out.is_dir():
        for p in out.iterdir():
            if p.name.startswith(".ctxfarm-fetch-") and p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)


_RENAME_EXCHANGE = 2


def _swap_into_place(staging: Path, out: Path) -> None:
    """``out`` becomes the staging dir; its old content ends in ``staging`` (then removed)."""
    if not out.exists():
        os.rename(staging, out)
        staging.mkdir()  # the caller removes it
        return
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd = -100
        rc = renameat2(at_fdcwd, os.fsencode(staging), at_fdcwd, os.fsencode(out), _RENAME_EXCHANGE)
        if rc == 0:
            return
    # No atomic exchange here (old kernel or libc, some filesystems): two renames, the window
    # between them is where --out is briefly absent.
    old = out.parent / f".{out.name}{STAGING_MARK}old-{time.time_ns()}"
    os.rename(out, old)
    os.rename(staging, out)
    os.rename(old, staging)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def receipt(result: FetchResult, extra: dict[str, Any]) -> dict[str, Any]:
    return {"artifact": result.artifact, "ctx_model": os.fspath(result.ctx_model),
            "files": [os.fspath(p) for p in result.files], "bytes": result.bytes, "signed_by": result.signed_by,
            **extra}
