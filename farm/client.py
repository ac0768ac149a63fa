"""The device (and pipeline) client of the HTTP service: the Python standard library only, so a
device image ships it with ``pip install 'ctxfarm[client]'`` (no onnx, SQLAlchemy or EPs;
``cryptography`` only when signatures are checked).

    from farm.client import install
    ctx_model = install("http://farm:8080", token, "super-res:stable", soc="SM8650", qnn="2.51.0",
                        dest="/data/models/super-res").ctx_model

``install``: resolve; download each file with resume (HTTP Range) into a partial directory that
survives an interruption; verify every size and sha256; verify the manifest against its digest
and bind it to what was asked (model, backend, target, toolchain); with trusted keys, require a
signature by one of them; then place the files atomically (``farm.core.placement``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.core.errors import (
    DigestMismatchError,
    FarmError,
    ManifestError,
    MissingExtraError,
    NoWorkerError,
    ServerError,
    SignatureError,
    UnsignedError,
    error_for_code,
)
from farm.core.names import inside, safe_relative
from farm.core.placement import STAGING_MARK, destination, staged

CHUNK = 1024 * 1024
PARTIAL = "partial"  # .<dest>.ctxfarm-partial: downloads kept across interruptions


@dataclass
class InstallResult:
    artifact: str
    ctx_model: Path
    files: list[Path]
    bytes: int
    resumed_bytes: int
    signed_by: str | None


class Client:
    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0):
        if not server.startswith(("http://", "https://")):
            raise ServerError(f"server {server[:80]!r} is not an http(s) URL", hint="e.g. http://127.0.0.1:8080")
        self.server, self.token, self.timeout = server.rstrip("/"), token, timeout

    def _request(self, method: str, path: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
                 query: dict[str, Any] | None = None) -> Any:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        h = {"Accept": "application/json", **(headers or {})}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=body, headers=h, method=method)
        try:
            return _OPENER.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise _error_of(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"cannot reach {self.server}: {getattr(exc, 'reason', exc)}") from None

    def json(self, method: str, path: str, payload: Any = None, **query: Any) -> Any:
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        with self._request(method, path, body=body, headers=headers, query=query) as resp:
            return json.loads(resp.read())

    def upload(self, path: Path, *, name: str | None = None, tag: str | None = None,
               force_tag: bool = False) -> dict[str, Any]:
        kinds = {".onnx": "application/octet-stream", ".tar": "application/x-tar", ".gz": "application/gzip",
                 ".tgz": "application/gzip", ".zip": "application/zip"}
        size = path.stat().st_size
        with open(path, "rb") as f:
            req_headers = {"Content-Type": kinds.get(path.suffix.lower(), "application/octet-stream"),
                           "Content-Length": str(size)}
            with self._request("POST", "/v1/models", body=f, headers=req_headers,  # type: ignore[arg-type]
                               query={"name": name, "tag": tag,
                                      "force_tag": "true" if force_tag else None}) as resp:
                return dict(json.loads(resp.read()))

    def download(self, url: str, dest: Path, *, digest: str, size: int) -> int:
        """Resume into ``dest`` with a Range request; verify size and sha256. Returns the bytes
        that were already there (resumed)."""
        have = dest.stat().st_size if dest.exists() else 0
        if have > size:
            dest.unlink()
            have = 0
        h = hashlib.sha256()
        if have:
            with open(dest, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        if have < size:
            path = url.removeprefix(self.server) if url.startswith(self.server) else url
            headers = {"Range": f"bytes={have}-"} if have else {}
            resp = self._request("GET", path, headers=headers) if path.startswith("/") else _open(url, headers)
            with resp, open(dest, "ab" if have and resp.status == 206 else "wb") as out:
                if resp.status != 206 and have:
                    h = hashlib.sha256()  # the server sent the whole blob: start over
                    have = 0
                while chunk := resp.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
        got = dest.stat().st_size
        if got != size or "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            raise DigestMismatchError(f"{dest.name}: downloaded content does not match its digest "
                                      f"({got} of {size} bytes)")
        return have


class _DropAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Blob GETs redirect to presigned S3 URLs: the bearer token must not follow them (it is
    not for the store, and S3 refuses a request with two kinds of authentication)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_DropAuthOnRedirect())


def _open(url: str, headers: dict[str, str]) -> Any:
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60)
    except urllib.error.HTTPError as exc:
        raise _error_of(exc) from None


def _error_of(exc: urllib.error.HTTPError) -> FarmError:
    try:
        err = json.loads(exc.read()).get("error", {})
        return error_for_code(err.get("code", "server-error"), err.get("message", str(exc)), hint=err.get("hint"),
                              fallback=ServerError)
    except (ValueError, AttributeError):
        return ServerError(f"HTTP {exc.code} from the service: {exc.reason}")


def install(server: str, token: str | None, model: str, *, dest: str | os.PathLike[str], soc: str | None = None,
            qnn: str | None = None, gpu: str | None = None, trt: str | None = None,
            platform: str = "linux-x86-64", trusted_keys: list[str] | None = None,
            require_signature: bool = False, allow_unsigned: bool = False) -> InstallResult:
    """Resolve, download (resuming), verify and place an artifact; see the module docstring."""
    client = Client(server, token)
    res = client.json("GET", "/v1/resolve", model=model, soc=soc, qnn=qnn, gpu=gpu, trt=trt,
                      platform=platform if gpu else None, manifest="false")
    artifact = str(res["artifact"])
    out = destination(Path(dest))
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    partial.mkdir(exist_ok=True)
    # The manifest is a blob: verified against its digest, then bound to the request.
    manifest_path = partial / "manifest.json"
    resumed = client.download(res["manifest_url"], manifest_path, digest=artifact, size=int(res["manifest_size"]))
    manifest = json.loads(manifest_path.read_bytes())
    _bind(manifest, res, soc=soc, gpu=gpu)
    signed_by = _check_signatures(artifact, res.get("signatures", []), trusted_keys or [],
                                  required=require_signature, allow_unsigned=allow_unsigned)
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise ManifestError("manifest lists no files")
    total = 0
    for f in files:
        safe_relative(str(f["name"]))
        part = partial / str(f["digest"]).removeprefix("sha256:")
        resumed += client.download(f"{client.server}/v1/blobs/{f['digest']}", part, digest=f["digest"],
                                   size=int(f["size"]))
        total += int(f["size"])
    written = []
    with staged(out) as staging:
        for f in files:
            target = inside(staging, str(f["name"]))
            target.parent.mkdir(parents=True, exist_ok=True)
            source = partial / str(f["digest"]).removeprefix("sha256:")
            # A sibling directory, the same filesystem: a hard link (a blob listed twice stays
            # whole for its second name), no second copy of a multi-GB file.
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
            written.append(out / str(f["name"]))
    shutil.rmtree(partial, ignore_errors=True)
    return InstallResult(artifact, out / safe_relative(str(manifest["ctxModel"])), written, total, resumed, signed_by)


def _bind(manifest: dict[str, Any], res: dict[str, Any], *, soc: str | None, gpu: str | None) -> None:
    want = (res.get("model"), res.get("target"), res.get("toolchain"))
    got = (manifest.get("model"), (manifest.get("target") or {}).get("name"),
           (manifest.get("toolchain") or {}).get("version"))
    if got != want:
        raise SignatureError(f"the manifest is for {got}, the service resolved {want}: not installing",
                             hint="the service's index points at another artifact; tell its operators")
    device = (soc or gpu or "").lower()
    if device and str(got[1]).lower() != device and manifest.get("backend") == "qnn":
        raise SignatureError(f"the artifact is built for {got[1]}, this device is {device}")


def _check_signatures(artifact: str, sigs: list[dict[str, str]], trusted: list[str], *, required: bool,
                      allow_unsigned: bool) -> str | None:
    if not trusted and not required:
        return None
    if not sigs:
        if required or not allow_unsigned:
            raise UnsignedError(f"artifact {artifact} carries no signature")
        return None
    import base64

    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        raise MissingExtraError("checking signatures needs the cryptography package",
                                hint="pip install 'ctxfarm[client,sign]'") from None
    for s in sigs:
        if s.get("public_key") not in trusted:
            continue
        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(s["public_key"]))
            key.verify(base64.b64decode(s["signature"]), b"ctxfarm-manifest-v1\n" + artifact.encode())
        except (InvalidSignature, ValueError):
            continue
        return hashlib.sha256(base64.b64decode(s["public_key"])).hexdigest()[:16]
    raise SignatureError(f"artifact {artifact}: no signature verifies with a trusted key")


def detect_qnn() -> str:
    """The QNN SDK version of the onnxruntime-qnn installed here (for ``farm install --detect``)."""
    from workers.backends import qnn_toolchain

    try:
        return qnn_toolchain().version
    except FarmError as exc:
        raise NoWorkerError(f"--detect: {exc.message}", hint="pass --qnn VERSION instead") from None


def wait_release(client: Client, release_id: int, *, timeout: float | None = None, poll: float = 1.0,
                 long_poll: float = 25.0, on_change: Any = None) -> Any:
    """Until the release is done. Each request is a long poll (``?wait=``): the service answers
    when a build changes, so nothing sleeps between answers; ``poll`` paces only a service that
    answers at once without change (one that predates the long poll)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Any = None
    while True:
        wait = long_poll if deadline is None else max(min(long_poll, deadline - time.monotonic()), 0.0)
        asked = time.monotonic()
        st = client.json("GET", f"/v1/releases/{release_id}", wait=f"{wait:.1f}")
        if on_change is not None:  # every answer: the caller shows what changed (farm submit --wait)
            on_change(st)
        if st["done"]:
            return st
        if deadline is not None and time.monotonic() > deadline:
            from farm.core.errors import CompileTimeoutError

            raise CompileTimeoutError(f"release {release_id} not finished after {timeout:g} s")
        seen = [(b["build"], b["state"], b["attempts"]) for b in st["builds"]]
        if seen == last and time.monotonic() - asked < min(poll, wait):
            time.sleep(poll)
        last = seen
