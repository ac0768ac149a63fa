"""The device (and pipeline) client of the HTTP service: the Python standard library only, so a
device installs it alone (``pip install ctxfarm-client``, built from ``infra/client/``: no onnx,
SQLAlchemy or EPs; ``cryptography`` only when signatures are checked).

    from farm.client import install
    ctx_model = install("http://farm:8080", token, "super-res:stable", soc="SM8650", qnn="2.51.0",
                        dest="/data/models/super-res").ctx_model

A device trusts no server: everything a service (or a man in the middle) sends is hostile input
until checked (docs/security.md, "Device client"). ``install``:

1. asks ``/v1/resolve`` and reads at most ``MAX_ANSWER_BYTES`` of the answer; checks the type of
   every field it uses and binds the answer to the question (the model it named, the backend,
   the SoC or GPU, a toolchain the runtime can load);
2. fetches the manifest by its digest (``/v1/blobs/<artifact>``, never a URL from the answer),
   stops at its declared size, checks the bytes hash to the artifact digest, its shape and every
   file name, digest and size (``farm.core.untrusted``), and that it says what the answer said;
   with trusted keys, requires a signature by one of them over that digest;
3. downloads each file with resume (HTTP Range) into a partial directory named by the file's
   checked digest, stopping at its declared size, and verifies size and sha256;
4. places the files atomically (``farm.core.placement``), each path checked to stay under --dest.

Redirects are followed to http(s) only (never https -> http), at most ``MAX_REDIRECTS``; the
bearer token never follows one. Every malformed answer is ``server-error`` (the answer) or
``bad-manifest`` (the manifest); content that does not match its digest is ``digest-mismatch``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.core.errors import (
    DigestMismatchError,
    FarmError,
    ManifestError,
    MissingExtraError,
    ServerError,
    SignatureError,
    StorageError,
    UnsignedError,
    UsageError,
    error_for_code,
)
from farm.core.keys import is_digest, parse_version
from farm.core.names import inside, safe_relative
from farm.core.placement import STAGING_MARK, destination, staged
from farm.core.untrusted import (
    BACKENDS,
    check_digest,
    check_manifest,
    check_size,
    check_target_name,
    check_version,
    clean_text,
    manifest_stages,
    shown,
)

CHUNK = 1024 * 1024
PARTIAL = "partial"  # .<dest>.ctxfarm-partial: downloads kept across interruptions
MAX_ANSWER_BYTES = 4 << 20  # a resolve answer is a few KiB
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KiB; its declared size must be under this
MAX_ERROR_BYTES = 64 << 10
MAX_REDIRECTS = 5
MAX_SIGNATURES = 64
# Errors a service may relay to a client as themselves: its own failures (5xx: a bug, its
# configuration, an interruption) are the service's problem, shown as server-error.
_RELAYED_BELOW = 500
_NOT_RELAYED = frozenset({"internal-error", "farm-error", "interrupted", "lease-lost", "bad-config", "missing-extra"})
# What a device can do about an answer it refused: it can't repair the service.
HINT_SERVER = "nothing was installed; the service sent an answer this client refuses: tell the service's operators"
HINT_DIGEST = ("the downloaded copy was discarded and nothing was installed; run the install again, and if it fails "
               "the same way tell the service's operators (their copy may be corrupt)")


@dataclass
class InstallResult:
    artifact: str
    ctx_model: Path
    files: list[Path]
    bytes: int
    resumed_bytes: int
    signed_by: str | None
    stages: list[dict[str, str]] = field(default_factory=list)  # each file's role (a group, a genai package)


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Blob GETs redirect to presigned S3 URLs: follow http(s) only, never from https down to
    http, a bounded number of times; the bearer token must not follow (it is not for the store,
    and S3 refuses a request with two kinds of authentication)."""

    max_redirections = MAX_REDIRECTS
    max_repeats = 2

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        old, new_scheme = urllib.parse.urlsplit(req.full_url).scheme, urllib.parse.urlsplit(newurl).scheme
        if new_scheme not in ("http", "https") or (old == "https" and new_scheme == "http"):
            raise ServerError(f"the service redirected to {shown(newurl)}: only http(s) redirects are followed "
                              "(never from https to http)", hint=HINT_SERVER)
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None:
            new.remove_header("Authorization")
        return new


def _opener() -> urllib.request.OpenerDirector:
    """http and https only: no file:, ftp: or data: handler is installed at all."""
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(), urllib.request.HTTPDefaultErrorHandler(), _Redirects(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


_OPENER = _opener()


class _Stream:
    """A request body read from byte strings and files in 1 MiB pieces (http.client sends an
    iterable piece by piece; from a file object it reads 8 KiB at a time). ``sent`` counts what
    went out. A file that shrank since it was measured stops the upload: its length was promised."""

    def __init__(self, parts: list[tuple[bytes | None, Path | None, int]], skip: int = 0):
        self.parts, self.sent, self.skip = parts, 0, skip

    def __iter__(self) -> Iterator[bytes]:
        skip = self.skip  # a resumed upload: the first ``skip`` bytes were sent before
        for data, path, size in self.parts:
            if skip >= size:
                skip -= size
                continue
            if data is not None:
                piece, skip = data[skip:], 0
                self.sent += len(piece)
                yield piece
                continue
            assert path is not None
            left = size - skip
            with open(path, "rb") as f:
                f.seek(skip)
                skip = 0
                while left > 0 and (chunk := f.read(min(CHUNK, left))):
                    left -= len(chunk)
                    self.sent += len(chunk)
                    yield chunk
            if left:
                raise ServerError(f"{path.name} shrank while it was being uploaded")


def _tar_parts(members: list[tuple[str, Path]]) -> tuple[list[tuple[bytes | None, Path | None, int]], int]:
    """The pieces of a tar of (name, file), its headers made here: the same bytes every time for
    the same files, so an upload cut short goes on from an offset."""
    import tarfile

    parts: list[tuple[bytes | None, Path | None, int]] = []
    total = 0
    for rel, path in members:
        size = path.stat().st_size
        info = tarfile.TarInfo(rel)
        info.size, info.mode, info.mtime = size, 0o644, 0
        header = info.tobuf(tarfile.PAX_FORMAT)
        pad = -size % tarfile.BLOCKSIZE
        parts += [(header, None, len(header)), (None, path, size), (b"\0" * pad, None, pad)]
        total += len(header) + size + pad
    parts.append((b"\0" * (2 * tarfile.BLOCKSIZE), None, 2 * tarfile.BLOCKSIZE))
    return parts, total + 2 * tarfile.BLOCKSIZE


def _session_id(value: Any) -> str:
    """An upload session id from the service: 32 hex digits, or the answer is refused (it goes
    into a URL path)."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{32}", value):
        raise ServerError(f"the service answered an upload session id {shown(value)}", hint=HINT_SERVER)
    return value
# Failures of the connection or of the peer's HTTP (too many or too long headers, a body cut
# short): the service is unreachable or broken, never a bug of ours.
_WIRE_ERRORS = (OSError, http.client.HTTPException, ValueError)


class Client:
    def __init__(self, server: str, token: str | None, *, timeout: float = 60.0):
        if not isinstance(server, str) or not server.startswith(("http://", "https://")):
            raise UsageError(f"server {shown(server)} is not an http(s) URL", hint="e.g. --server http://127.0.0.1:8080")
        self.server, self.token, self.timeout = server.rstrip("/"), token, timeout

    def _request(self, method: str, path: str, *, body: Any = None, headers: dict[str, str] | None = None,
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
        except urllib.error.URLError as exc:
            raise ServerError(f"cannot reach {self.server}: {clean_text(str(exc.reason), 200)}") from None
        except _WIRE_ERRORS as exc:
            raise ServerError(f"cannot reach {self.server}: {clean_text(str(exc) or type(exc).__name__, 200)}") from None

    def json(self, method: str, path: str, payload: Any = None, **query: Any) -> Any:
        """A JSON answer, at most ``MAX_ANSWER_BYTES`` read; anything else is server-error. The
        caller checks the shape of what it uses."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        what = f"the answer to {method} {path}"
        with self._request(method, path, body=body, headers=headers, query=query) as resp:
            data = _read_capped(resp, MAX_ANSWER_BYTES, what, deadline=time.monotonic() + 2 * self.timeout)
        return _parse_json(data, what, ServerError)

    def upload(self, path: Path, *, name: str | None = None, tag: str | None = None,
               force_tag: bool = False) -> dict[str, Any]:
        kinds = {".onnx": "application/octet-stream", ".tar": "application/x-tar", ".gz": "application/gzip",
                 ".tgz": "application/gzip", ".zip": "application/zip"}
        size = path.stat().st_size
        return self._post_model(_Stream([(None, path, size)]), size,
                                kinds.get(path.suffix.lower(), "application/octet-stream"), name, tag, force_tag)

    def _post_model(self, body: _Stream, size: int, content_type: str, name: str | None, tag: str | None,
                    force_tag: bool) -> dict[str, Any]:
        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        with self._request("POST", "/v1/models", body=body, headers=headers,
                           query={"name": name, "tag": tag, "force_tag": "true" if force_tag else None}) as resp:
            answer = _parse_json(_read_capped(resp, MAX_ANSWER_BYTES, "the upload's answer",
                                              deadline=time.monotonic() + 2 * self.timeout),
                                 "the upload's answer", ServerError)
        if not isinstance(answer, dict):
            raise ServerError("the upload's answer is not a JSON object", hint=HINT_SERVER)
        return answer

    def held(self, digest: str, *, name: str | None = None, tag: str | None = None,
             force_tag: bool = False) -> dict[str, Any] | None:
        """Hash first: ``POST /v1/models/DIGEST`` sets NAME:TAG on a bundle the service already
        holds and answers as an upload does, with no model bytes sent; None when the service
        does not hold it (or predates the route): then ``upload_bundle``."""
        from farm.core.errors import NotFoundError

        try:
            answer = self.json("POST", f"/v1/models/{urllib.parse.quote(digest)}", None, name=name, tag=tag,
                               force_tag="true" if force_tag else None)
        except NotFoundError:
            return None
        except ServerError as exc:
            if "HTTP 404" in exc.message or "HTTP 405" in exc.message:
                return None  # a service without the route: upload
            raise
        if not isinstance(answer, dict) or answer.get("digest") != digest:
            raise ServerError("the answer to a held-model request names another model", hint=HINT_SERVER)
        return answer

    def upload_bundle(self, members: list[tuple[str, Path]], *, name: str | None = None, tag: str | None = None,
                      force_tag: bool = False) -> dict[str, Any]:
        """Upload a model bundle: a lone .onnx as it is; with external data, a tar of (name,
        file) written as it is sent, 1 MiB at a time, its length known before the first byte:
        memory stays flat whatever the size."""
        if len(members) == 1:
            return self.upload(members[0][1], name=name, tag=tag, force_tag=force_tag)
        parts, total = _tar_parts(members)
        return self._post_model(_Stream(parts), total, "application/x-tar", name, tag, force_tag)

    def upload_resumable(self, members: list[tuple[str, Path]], *, name: str | None = None, tag: str | None = None,
                         force_tag: bool = False, session: str | None = None,
                         on_session: Any = None) -> dict[str, Any]:
        """Upload a bundle through an upload session (``/v1/uploads``) that survives a cut
        connection: ``session`` (an id ``on_session`` was given by an earlier call) is asked where
        it stands and the bundle goes on from there; the bytes are the same tar (or .onnx) as
        ``upload_bundle``'s, so a piece sent earlier is never sent again."""
        if len(members) == 1:
            path = members[0][1]
            size = path.stat().st_size
            parts: list[tuple[bytes | None, Path | None, int]] = [(None, path, size)]
            total, kind = size, "application/octet-stream"
        else:
            parts, total = _tar_parts(members)
            kind = "application/x-tar"
        offset = 0
        if session is not None:
            try:
                offset = check_size(self.json("GET", f"/v1/uploads/{_session_id(session)}").get("offset"))
            except (FarmError, AttributeError):
                session = None
        if session is None or offset > total:
            from farm.core.errors import NotFoundError

            try:
                answer = self.json("POST", "/v1/uploads")
            except NotFoundError:  # a service without upload sessions: one request, not resumable
                return self.upload_bundle(members, name=name, tag=tag, force_tag=force_tag)
            session, offset = _session_id(answer.get("upload") if isinstance(answer, dict) else None), 0
            if on_session is not None:
                on_session(session)
        if offset < total:
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(total - offset),
                       "Upload-Offset": str(offset)}
            with self._request("PATCH", f"/v1/uploads/{session}", body=_Stream(parts, skip=offset),
                               headers=headers) as resp:
                _read_capped(resp, MAX_ANSWER_BYTES, "the upload's answer",
                             deadline=time.monotonic() + 2 * self.timeout)
        answer = self.json("POST", f"/v1/uploads/{session}/complete", None, name=name, tag=tag,
                           force_tag="true" if force_tag else None, bundle_type=kind)
        if not isinstance(answer, dict):
            raise ServerError("the upload's answer is not a JSON object", hint=HINT_SERVER)
        return answer

    def manifest_bytes(self, digest: str, size: int) -> bytes:
        """An artifact's manifest, fetched by its digest: at most ``size`` bytes read, then
        checked to hash to ``digest`` (bad-manifest otherwise). ``digest`` and ``size`` must
        already be checked."""
        with self._request("GET", f"/v1/blobs/{digest}", headers={"Accept": "*/*"}) as resp:
            _check_length(resp, size, digest)
            data = _read_capped(resp, size, f"manifest {digest[7:19]}", deadline=time.monotonic() + 2 * self.timeout,
                                stop=True)
        if len(data) < size:
            raise ServerError(f"manifest {digest[7:19]}: the service sent {len(data)} of {size} bytes",
                              hint="run the install again")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ManifestError(f"manifest {digest[7:19]} does not match its digest: it is not the manifest the "
                                "service named", hint=HINT_SERVER)
        return data

    def download(self, digest: str, dest: Path, *, size: int) -> int:
        """Resume into ``dest`` with a Range request, reading no byte past ``size``; verify size
        and sha256. Returns the bytes that were already there (resumed). ``digest`` and ``size``
        must already be checked; ``dest`` is named by the digest."""
        if dest.is_symlink() or (dest.exists() and not dest.is_file()):
            _remove(dest)
        have = dest.stat().st_size if dest.exists() else 0
        if have > size:
            dest.unlink()
            have = 0
        h = hashlib.sha256()
        if have:
            with open(dest, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        resumed = have
        if have < size:
            headers = {"Accept": "*/*", **({"Range": f"bytes={have}-"} if have else {})}
            with self._request("GET", f"/v1/blobs/{digest}", headers=headers) as resp:
                if have and not (resp.status == 206 and _range_start(resp) == have):
                    h, have, resumed = hashlib.sha256(), 0, 0  # the whole blob (or a range we did not ask): start over
                if resp.status not in (200, 206) or (resp.status == 206 and not resumed):
                    raise ServerError(f"blob {digest[7:19]}: unexpected HTTP {resp.status}", hint=HINT_SERVER)
                _check_length(resp, size - have, digest)
                with open(dest, "ab" if have else "wb") as out:
                    left = size - have
                    try:
                        while left > 0 and (chunk := resp.read(min(CHUNK, left))):
                            h.update(chunk)
                            out.write(chunk)
                            left -= len(chunk)
                    except _WIRE_ERRORS as exc:
                        raise ServerError(f"blob {digest[7:19]}: the download broke off "
                                          f"({clean_text(str(exc) or type(exc).__name__, 200)})",
                                          hint="run the install again: it resumes where this one stopped") from None
        got = dest.stat().st_size
        if got < size:
            raise ServerError(f"blob {digest[7:19]}: the service sent {got} of {size} bytes",
                              hint="run the install again: it resumes where this one stopped")
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            if resumed:  # the bytes kept from before may be the bad ones: once more, from scratch
                return self.download(digest, dest, size=size)
            raise DigestMismatchError(f"blob {digest[7:19]}: downloaded content does not match its digest "
                                      f"({got} of {size} bytes)", hint=HINT_DIGEST)
        return resumed


def _range_start(resp: Any) -> int | None:
    m = re.fullmatch(r"bytes (\d{1,19})-\d{1,19}/(\d{1,19}|\*)", (resp.headers.get("Content-Range") or "").strip())
    return int(m.group(1)) if m else None


def _check_length(resp: Any, expected: int, digest: str) -> None:
    """A Content-Length other than the bytes the manifest declares is refused before reading."""
    raw = resp.headers.get("Content-Length")
    if raw is None:
        return
    if not raw.strip().isdigit() or int(raw) != expected:
        raise ServerError(f"blob {digest[7:19]}: the service sends {shown(raw, 30)} bytes, "
                          f"{expected} were declared", hint=HINT_SERVER)


def _read_capped(resp: Any, cap: int, what: str, *, deadline: float, stop: bool = False) -> bytes:
    """At most ``cap`` bytes of ``resp``. More is server-error, unless ``stop``: then reading
    simply stops at ``cap`` (a blob's declared size). A body that trickles past ``deadline``
    is server-error too (a slow peer can't hold a device forever)."""
    raw = resp.headers.get("Content-Length")
    if not stop and raw is not None and raw.strip().isdigit() and int(raw) > cap:
        raise ServerError(f"{what} is {int(raw)} bytes, over the {cap} this client reads", hint=HINT_SERVER)
    buf = bytearray()
    limit = cap if stop else cap + 1
    try:
        while len(buf) < limit:
            # read1: whatever has arrived, so a trickling body meets its deadline between bytes
            chunk = resp.read1(min(CHUNK, limit - len(buf)))
            if not chunk:
                break
            buf += chunk
            if time.monotonic() > deadline:
                raise ServerError(f"{what} did not arrive in time", hint=HINT_SERVER)
    except _WIRE_ERRORS as exc:
        raise ServerError(f"{what} broke off: {clean_text(str(exc) or type(exc).__name__, 200)}") from None
    if len(buf) > cap:
        raise ServerError(f"{what} is over the {cap} bytes this client reads", hint=HINT_SERVER)
    return bytes(buf)


def _parse_json(data: bytes, what: str, error: type[FarmError]) -> Any:
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, NaN, nested past the stack
        raise error(f"{what} is not JSON", hint=HINT_SERVER) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _error_of(exc: urllib.error.HTTPError) -> FarmError:
    """An HTTP error answer as the error it documents: a 4xx with a known code is relayed (its
    text cleaned and cut); the service's own failures and anything else are server-error."""
    try:
        body = exc.read(MAX_ERROR_BYTES + 1) if exc.fp is not None else b""
    except _WIRE_ERRORS:
        body = b""
    err: Any = None
    if len(body) <= MAX_ERROR_BYTES:
        try:
            err = json.loads(body).get("error")
        except (ValueError, RecursionError, AttributeError):
            err = None
    status = int(exc.code) if isinstance(exc.code, int) else 0
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return ServerError(f"HTTP {status} from the service: {clean_text(str(exc.reason), 200)}")
    code, message = clean_text(err["code"], 60), clean_text(err.get("message"), 1000)
    hint = clean_text(err.get("hint"), 1000) or None
    if status >= _RELAYED_BELOW or code in _NOT_RELAYED:
        return ServerError(f"the service failed (HTTP {status}, {code}): {message}",
                           hint="nothing was changed here; try again later, or tell the service's operators")
    if code == "no-match" and hint:
        # The service explains what its operators could build; a device can only ask for it.
        hint = f"nothing loads on this device yet: ask the service's operators for a build ({hint})"
    return error_for_code(code, message, hint=hint, fallback=ServerError)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


# ---- install: resolve, bind, verify, place --------------------------------------------------------

@dataclass(frozen=True)
class Question:
    """What a device asked for; the answer must be for exactly this."""

    model: str
    backend: str
    target: str  # canonical name where the local catalog knows it, else as given
    runtime: str  # QNN SDK version, or TensorRT version
    platform: str | None = None  # TensorRT: the device's OS-CPU


def question(model: str, soc: str | None, qnn: str | None, gpu: str | None, trt: str | None,
              platform: str) -> Question:
    from farm.core.catalog import load_catalog
    from farm.core.errors import UnknownTargetError

    if not isinstance(model, str) or not model or len(model) > 300:
        raise UsageError("which model? give NAME:TAG, NAME or a model digest")
    backend, device, runtime = ("trt", gpu, trt) if (gpu or trt) else ("qnn", soc, qnn)
    if not device or not runtime:
        raise UsageError("a device is described by --soc and --qnn (or --gpu and --trt)",
                         hint="e.g. --soc SM8650 --qnn 2.51.0 (or --detect to read the QNN version installed here)")
    try:
        target = load_catalog().get(device, backend=backend).name
    except UnknownTargetError:
        target = device  # a SoC newer than this client's catalog: the service may know it
    return Question(model, backend, target, runtime, platform if backend == "trt" else None)


def check_answer(res: Any, q: Question) -> dict[str, Any]:
    """A resolve answer: the type of every field used, and that it answers ``q``."""
    if not isinstance(res, dict):
        raise ServerError("the resolve answer is not a JSON object", hint=HINT_SERVER)
    try:
        check_digest(res.get("artifact"), "the answer's artifact")
        check_digest(res.get("model"), "the answer's model")
        check_target_name(res.get("target"), "the answer's target")
        check_version(res.get("toolchain"), "the answer's toolchain")
        check_size(res.get("manifest_size"), "the answer's manifest_size", limit=MAX_MANIFEST_BYTES)
    except ManifestError as exc:
        raise ServerError(f"the resolve answer is malformed: {exc.message}", hint=HINT_SERVER) from None
    sigs = res.get("signatures", [])
    if not isinstance(sigs, list) or len(sigs) > MAX_SIGNATURES or not all(
            isinstance(s, dict) and isinstance(s.get("public_key"), str) and isinstance(s.get("signature"), str)
            and len(s["public_key"]) <= 200 and len(s["signature"]) <= 200 for s in sigs):
        raise ServerError("the resolve answer's signatures are malformed", hint=HINT_SERVER)
    if res.get("backend") not in BACKENDS:
        raise ServerError(f"the resolve answer's backend {shown(res.get('backend'))} is unknown", hint=HINT_SERVER)

    def refuse(what: str) -> ServerError:
        return ServerError(f"the service answered for {what}: not installing", hint=HINT_SERVER)

    if res["backend"] != q.backend:
        raise refuse(f"backend {shown(res['backend'])}, this device asked for {q.backend}")
    if is_digest(q.model) and res["model"] != q.model:
        raise refuse(f"model {res['model']}, this device asked for {q.model}")
    if q.backend == "qnn":
        # A QNN context serves the SoCs it was built for (several for a multi-SoC target), and
        # only a runtime at least as new as the SDK that built it.
        if q.target.lower() not in {s.lower() for s in res["target"].split("+")}:
            raise refuse(f"target {shown(res['target'])}, this device is {q.target}")
        if parse_version(res["toolchain"]) > parse_version(q.runtime):
            raise refuse(f"QNN {shown(res['toolchain'])}, newer than this device's runtime {q.runtime}")
    else:
        built, _, built_platform = res["toolchain"].partition("+")
        if parse_version(built) != parse_version(q.runtime) or (built_platform and built_platform != q.platform):
            raise refuse(f"TensorRT {shown(res['toolchain'])}, this device runs {q.runtime}+{q.platform}")
    return res


def _check_manifest_binding(manifest: dict[str, Any], res: dict[str, Any], q: Question) -> None:
    """The manifest (the signed document) says what the answer said, and for a TensorRT engine
    built for another GPU, that it was built hardware-compatible."""
    got = (manifest["model"], manifest["backend"], manifest["target"]["name"], manifest["toolchain"]["version"])
    want = (res["model"], res["backend"], res["target"], res["toolchain"])
    if got != want:
        diffs = [f"{k}: manifest {shown(g)} != answer {shown(w)}"
                 for k, g, w in zip(("model", "backend", "target", "toolchain"), got, want, strict=True) if g != w]
        raise ManifestError("the manifest is not for what the service answered (" + "; ".join(diffs) + ")",
                            hint=HINT_SERVER)
    if q.backend == "trt" and manifest["target"]["name"].lower() != q.target.lower():
        options = manifest.get("options") or {}
        if options.get("hardware_compatibility_level") != "ampere_plus":
            raise ManifestError(f"the engine is built for {shown(manifest['target']['name'])}, not for this "
                                f"device's {q.target}, and not hardware-compatible", hint=HINT_SERVER)


def install(server: str, token: str | None, model: str, *, dest: str | os.PathLike[str], soc: str | None = None,
            qnn: str | None = None, gpu: str | None = None, trt: str | None = None,
            platform: str = "linux-x86-64", trusted_keys: list[str] | None = None,
            require_signature: bool = False, allow_unsigned: bool = False, timeout: float = 60.0) -> InstallResult:
    """Resolve, download (resuming), verify and place an artifact; see the module docstring.
    ``timeout``: seconds any network operation may wait (an answer's body gets twice that)."""
    q = question(model, soc, qnn, gpu, trt, platform)
    client = Client(server, token, timeout=timeout)
    res = check_answer(client.json("GET", "/v1/resolve", model=model, soc=soc, qnn=qnn, gpu=gpu, trt=trt,
                                    platform=platform if gpu else None, manifest="false"), q)
    artifact: str = res["artifact"]
    # The manifest is fetched by the digest that names the artifact, never from a URL in the
    # answer, then bound to the answer; signatures are over that digest.
    data = client.manifest_bytes(artifact, res["manifest_size"])
    try:
        manifest = check_manifest(_parse_json(data, f"manifest {artifact[7:19]}", ManifestError))
    except ManifestError as exc:
        raise ManifestError(exc.message, hint=HINT_SERVER) from None
    _check_manifest_binding(manifest, res, q)
    stages = manifest_stages(manifest)  # refused before anything is written
    signed_by = _check_signatures(artifact, res.get("signatures", []), trusted_keys or [],
                                  required=require_signature, allow_unsigned=allow_unsigned)
    out = destination(Path(dest))
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        _remove(partial)
    partial.mkdir(exist_ok=True)
    files: list[dict[str, Any]] = manifest["files"]
    _check_room(partial, files)
    resumed = total = 0
    for f in files:
        # Named by the checked digest (64 hex digits), never by anything else the server said.
        resumed += client.download(f["digest"], partial / f["digest"][7:], size=f["size"])
        total += f["size"]
    written = []
    with staged(out) as staging:
        for f in files:
            target = inside(staging, f["name"])
            target.parent.mkdir(parents=True, exist_ok=True)
            source = partial / f["digest"][7:]
            # A sibling directory, the same filesystem: a hard link (a blob listed twice stays
            # whole for its second name), no second copy of a multi-GB file.
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
            written.append(out / safe_relative(f["name"]))
    shutil.rmtree(partial, ignore_errors=True)
    return InstallResult(artifact, out / safe_relative(manifest["ctxModel"]), written, total, resumed, signed_by,
                         stages)


def _check_room(partial: Path, files: list[dict[str, Any]]) -> None:
    """Declared sizes that the device's disk can't hold are refused before a byte is fetched (a
    server can't fill a device by declaring a terabyte); files placed are hard links of the
    downloads, so the artifact needs its size once."""
    need = 0
    for digest, size in {f["digest"]: f["size"] for f in files}.items():
        kept = partial / digest[7:]
        need += max(size - (kept.stat().st_size if kept.is_file() and not kept.is_symlink() else 0), 0)
    free = shutil.disk_usage(partial).free
    if need > free:
        raise StorageError(f"the artifact needs {need} more bytes, {free} are free where --dest is: nothing was "
                           "downloaded", hint="free space on the device or pick a --dest on a larger filesystem")


def _check_signatures(artifact: str, sigs: list[dict[str, str]], trusted: list[str], *, required: bool,
                      allow_unsigned: bool) -> str | None:
    if not trusted and not required:
        return None
    if not sigs:
        if required or not allow_unsigned:
            raise UnsignedError(f"artifact {artifact} carries no signature",
                                hint="nothing was installed; ask the service's operators to sign it, or accept "
                                     "unsigned artifacts on this device (--allow-unsigned / FARM_ALLOW_UNSIGNED=1)")
        return None
    import base64

    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ModuleNotFoundError:
        raise MissingExtraError("checking signatures needs the cryptography package",
                                hint="pip install cryptography") from None
    for s in sigs:
        if s.get("public_key") not in trusted:
            continue
        try:
            key = ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(s["public_key"]))
            key.verify(base64.b64decode(s["signature"]), b"ctxfarm-manifest-v1\n" + artifact.encode())
        except (InvalidSignature, ValueError):
            continue
        return hashlib.sha256(base64.b64decode(s["public_key"])).hexdigest()[:16]
    raise SignatureError(f"artifact {artifact}: no signature verifies with a trusted key",
                         hint="nothing was installed: the artifact is not signed by a key this device trusts "
                              "(FARM_TRUSTED_KEYS)")


_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*=\s*(['\"])([^'\"]*)\2\s*$", re.MULTILINE)


def detect_qnn() -> str:
    """The QNN SDK version inside the onnxruntime-qnn installed here (for ``--detect``), read
    from the ``build_and_package_info.py`` the wheel carries, not imported."""
    import importlib.util

    from farm.core.catalog.runtimes import qnn_map_text

    spec = importlib.util.find_spec("onnxruntime_qnn")
    info: dict[str, str] = {}
    if spec is not None and spec.submodule_search_locations:
        try:
            text = (Path(next(iter(spec.submodule_search_locations))) / "build_and_package_info.py").read_text("utf-8")
            info = {m.group(1): m.group(3) for m in _ASSIGN.finditer(text)}
        except OSError:
            pass
    sdk = info.get("qnn_version", "")
    if not re.fullmatch(r"\d+(\.\d+){1,3}", sdk):
        found = f"onnxruntime-qnn {info['__version__']} does not say its QNN version" if info.get("__version__") \
            else "onnxruntime-qnn is not installed in this Python"
        raise UsageError(f"--detect: {found}",
                         hint=f"give the device's QNN runtime version with --qnn VERSION ({qnn_map_text()})")
    return sdk


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
        if not isinstance(st, dict) or not isinstance(st.get("builds"), list):
            raise ServerError(f"the answer for release {release_id} is malformed", hint=HINT_SERVER)
        if on_change is not None:  # every answer: the caller shows what changed (farm submit --wait)
            on_change(st)
        if st.get("done"):
            return st
        if deadline is not None and time.monotonic() > deadline:
            from farm.core.errors import CompileTimeoutError

            raise CompileTimeoutError(f"release {release_id} not finished after {timeout:g} s")
        seen = [(b.get("build"), b.get("state"), b.get("attempts")) for b in st["builds"] if isinstance(b, dict)]
        if seen == last and time.monotonic() - asked < min(poll, wait):
            time.sleep(poll)
        last = seen


# ---- ctxfarm-install: the device wheel's command ---------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """``ctxfarm-install``: ``farm install`` for a device that has only this wheel. Every error
    is ``error[code]: message`` and its hint, exit 1 (2 for usage); a traceback only for a bug
    with FARM_DEBUG=1."""
    import argparse

    p = argparse.ArgumentParser(prog="ctxfarm-install",
                                description="Install a compiled context from a ctxfarm service into --dest.")
    p.add_argument("--server", default=os.environ.get("FARM_SERVER"), help="e.g. http://farm:8080 (FARM_SERVER)")
    p.add_argument("--token", default=os.environ.get("FARM_TOKEN"), help="read token (FARM_TOKEN)")
    p.add_argument("--model", "-m", required=True, help="NAME:TAG, NAME or a model digest")
    p.add_argument("--soc", help="device SoC (Build.SOC_MODEL), e.g. SM8650")
    p.add_argument("--qnn", metavar="VERSION", help="the device's QNN runtime version, e.g. 2.51.0")
    p.add_argument("--detect", action="store_true", help="read --qnn from the onnxruntime-qnn installed here")
    p.add_argument("--gpu", help="device GPU, e.g. sm_89 (TensorRT)")
    p.add_argument("--trt", metavar="VERSION", help="TensorRT runtime version, all four parts")
    p.add_argument("--platform", default="linux-x86-64")
    p.add_argument("--dest", "-d", required=True, metavar="DIR", help="directory that will hold exactly this artifact")
    p.add_argument("--require-signature", action="store_true")
    p.add_argument("--allow-unsigned", action="store_true")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="how long any network operation may wait (default 60)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    env = os.environ
    try:
        from farm.core.settings import parse_bool, parse_trusted_keys

        if not args.server:
            raise UsageError("ctxfarm-install needs --server (or FARM_SERVER)", hint="e.g. --server http://farm:8080")
        qnn = detect_qnn() if args.detect else args.qnn
        result = install(args.server, args.token, args.model, dest=args.dest, soc=args.soc, qnn=qnn, gpu=args.gpu,
                         trt=args.trt, platform=args.platform,
                         trusted_keys=list(parse_trusted_keys(env.get("FARM_TRUSTED_KEYS", ""))),
                         require_signature=args.require_signature
                         or parse_bool("FARM_REQUIRE_SIGNATURE", env.get("FARM_REQUIRE_SIGNATURE")),
                         allow_unsigned=args.allow_unsigned
                         or parse_bool("FARM_ALLOW_UNSIGNED", env.get("FARM_ALLOW_UNSIGNED")),
                         timeout=args.timeout)
    except Exception as exc:  # the boundary: documented codes only
        from farm.core.errors import translate

        err = translate(exc)
        if err.code == "internal-error" and env.get("FARM_DEBUG"):
            raise
        print(f"error[{err.code}]: {err.message}", file=sys.stderr)
        if err.hint:
            print(f"  hint: {err.hint}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": err.to_dict()}))
        return err.exit_code
    if args.json:
        print(json.dumps({"artifact": result.artifact, "ctx_model": str(result.ctx_model),
                          "files": [str(p) for p in result.files], "bytes": result.bytes,
                          "resumed_bytes": result.resumed_bytes, "signed_by": result.signed_by}, indent=2))
    else:
        print(str(result.ctx_model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
