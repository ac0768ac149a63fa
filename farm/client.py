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
3. takes each file --dest already holds at its name and size (a hard link, verified like a
   download: a re-install of an up-to-date destination fetches nothing and changes nothing);
   downloads the others with resume into a partial directory named by the file's checked
   digest, a large file in ranges over ``connections`` connections at once (each range asked
   exactly and accepted only as exactly that range; what was written recorded as it lands, so
   an interruption loses nothing), stopping at its declared size; verifies size and sha256;
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
import stat as stat_module
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
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
from farm.core.placement import STAGING_MARK, destination, file_lock, staged
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
# Large files come in ranges over several connections at once (as S3 clients do: boto3's
# transfer manager asks 8 MiB parts over 10 connections); a smaller file in one stream.
RANGE_PART = 8 << 20
RANGED_FROM = 2 * RANGE_PART
CONNECTIONS = 4
MAX_CONNECTIONS = 16
RANGES_SUFFIX = ".ranges"  # partial/<hex>.ranges: the byte ranges of partial/<hex> written so far
MAX_RANGES_BYTES = 1 << 20
# Errors a service may relay to a client as themselves: its own failures (5xx: a bug, its
# configuration, an interruption) are the service's problem, shown as server-error.
_RELAYED_BELOW = 500
_NOT_RELAYED = frozenset({"internal-error", "farm-error", "interrupted", "lease-lost", "bad-config", "missing-extra"})
# What a device can do about an answer it refused: it can't repair the service.
HINT_SERVER = "nothing was installed; the service sent an answer this client refuses: tell the service's operators"
HINT_RESUME = "run the install again: it resumes where this one stopped"
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
    downloaded_bytes: int = 0  # received over the network for this install's files
    reused_bytes: int = 0  # verified where --dest already held them: not fetched, not moved
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
        # What blob downloads cost: payload bytes received and requests made (an up-to-date
        # destination costs neither); what uploads cost: request-body bytes sent.
        self.received = self.requests = self.sent = 0
        self._counted = threading.Lock()

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
        finally:
            if isinstance(body, _Stream):
                self.sent += body.sent

    def json(self, method: str, path: str, payload: Any = None, **query: Any) -> Any:
        """A JSON answer, at most ``MAX_ANSWER_BYTES`` read; anything else is server-error. The
        caller checks the shape of what it uses."""
        return self.json_status(method, path, payload, **query)[0]

    def json_status(self, method: str, path: str, payload: Any = None, **query: Any) -> tuple[Any, int, float | None]:
        """``json``'s answer with its status (a 2xx) and its Retry-After in seconds (None
        without one, or not a number of seconds)."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        what = f"the answer to {method} {path}"
        with self._request(method, path, body=body, headers=headers, query=query) as resp:
            data = _read_capped(resp, MAX_ANSWER_BYTES, what, deadline=time.monotonic() + 2 * self.timeout)
            status, retry = int(resp.status), (resp.headers.get("Retry-After") or "").strip()
        return (_parse_json(data, what, ServerError), status,
                float(retry) if retry.isdigit() and len(retry) < 6 else None)

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

    def blob_held(self, digest: str) -> bool:
        """Hash first, one file: ``HEAD /v1/blobs/DIGEST`` (200: the service holds it)."""
        from farm.core.errors import NotFoundError

        try:
            with self._request("HEAD", f"/v1/blobs/{urllib.parse.quote(digest)}"):
                return True
        except NotFoundError:
            return False
        except ServerError as exc:
            if "HTTP 404" in exc.message:
                return False  # a HEAD answer has no body: its code is the status alone
            raise

    def put_blob(self, path: Path, digest: str, size: int) -> dict[str, Any]:
        """``PUT /v1/blobs/DIGEST``: the file, streamed 1 MiB at a time (the service hashes it and
        stores it only under the digest it hashes to)."""
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with self._request("PUT", f"/v1/blobs/{urllib.parse.quote(digest)}", body=_Stream([(None, path, size)]),
                           headers=headers) as resp:
            answer = _parse_json(_read_capped(resp, MAX_ANSWER_BYTES, "the blob upload's answer",
                                              deadline=time.monotonic() + 2 * self.timeout),
                                 "the blob upload's answer", ServerError)
        if not isinstance(answer, dict) or answer.get("digest") != digest:
            raise ServerError("the answer to a blob upload names another blob", hint=HINT_SERVER)
        return answer

    def send_blobs(self, files: Sequence[tuple[Path, str, int]]) -> tuple[int, int]:
        """Each (path, digest, size) the service does not hold, sent once per digest (asked
        first: ``blob_held``). Returns (files sent, bytes sent)."""
        seen: set[str] = set()
        sent = nbytes = 0
        for path, digest, size in files:
            if digest in seen:
                continue
            seen.add(digest)
            if not self.blob_held(digest):
                self.put_blob(path, digest, size)
                sent, nbytes = sent + 1, nbytes + size
        return sent, nbytes

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

    def download(self, digest: str, dest: Path, *, size: int, connections: int = 1) -> int:
        """Fetch blob ``digest`` into ``dest``, resuming what an earlier call kept there, reading
        no byte past ``size``; verify size and sha256. Returns the bytes that were already there
        (resumed). ``digest`` and ``size`` must already be checked; ``dest`` is named by the digest.

        A blob of at least ``RANGED_FROM`` bytes with ``connections`` > 1 comes in ranges of
        ``RANGE_PART`` bytes over that many connections at once (``_download_ranged``); a smaller
        one, or one from a service that ignores ``Range``, in one stream."""
        # Two installs into one place share the partial directory: one writes a blob at a time.
        lock = dest.with_name(dest.name + ".lock")
        if lock.is_symlink():
            lock.unlink()
        with file_lock(lock):
            if dest.is_symlink() or (dest.exists() and not dest.is_file()):
                _remove(dest)
            if connections > 1 and size >= RANGED_FROM:
                return self._download_ranged(digest, dest, size=size, connections=min(connections, MAX_CONNECTIONS))
            return self._download_stream(digest, dest, size=size)

    def _download_stream(self, digest: str, dest: Path, *, size: int) -> int:
        """One stream, resumed from the contiguous bytes kept at the start of ``dest``."""
        have = _kept_prefix(dest, size)
        h = hashlib.sha256()
        if have:
            with open(dest, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
        resumed = have
        if have < size:
            headers = {"Accept": "*/*", **({"Range": f"bytes={have}-"} if have else {})}
            self._count(0, request=True)
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
                            self._count(len(chunk))
                    except _WIRE_ERRORS as exc:
                        raise ServerError(f"blob {digest[7:19]}: the download broke off "
                                          f"({clean_text(str(exc) or type(exc).__name__, 200)})",
                                          hint=HINT_RESUME) from None
        got = dest.stat().st_size
        if got < size:
            raise ServerError(f"blob {digest[7:19]}: the service sent {got} of {size} bytes", hint=HINT_RESUME)
        if "sha256:" + h.hexdigest() != digest:
            dest.unlink(missing_ok=True)
            if resumed:  # the bytes kept from before may be the bad ones: once more, from scratch
                return self._download_stream(digest, dest, size=size)
            raise DigestMismatchError(f"blob {digest[7:19]}: downloaded content does not match its digest "
                                      f"({got} of {size} bytes)", hint=HINT_DIGEST)
        return resumed

    def _download_ranged(self, digest: str, dest: Path, *, size: int, connections: int) -> int:
        """The missing ranges of ``dest`` (``plan_ranges``: those an earlier call recorded as
        written in ``dest``'s ``.ranges`` file are kept) over ``connections`` connections, each
        range asked with ``Range`` and accepted only as a 206 whose ``Content-Range`` is exactly
        that range of exactly ``size`` bytes, read up to its end and no further. The first range
        goes to the service; where it redirected (a presigned S3 URL), the other ranges go
        straight there, without the token. Meanwhile this thread hashes the file in order as its
        prefix fills. What was written is recorded as it lands, so an interruption (a cut
        connection, a refused answer, a kill) loses no range already written. A service that
        answers the first range with the whole blob (200: it ignores ``Range``) gets one stream."""
        done = _load_ranges(dest, size)
        resumed = _covered(done)
        plan = plan_ranges(size, done, RANGE_PART)
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            state = _RangeState(dest, size, done)
            if plan:
                state.save()  # before the first byte: holes in the file are never taken for data
                url = self.server + f"/v1/blobs/{digest}"
                first = plan[0]
                resp = self._get_range(url, True, first)
                if resp.status == 200:  # Range ignored: the whole blob in one stream, from scratch
                    resp.close()
                    os.close(fd)
                    fd = -1
                    _drop_ranges(dest)
                    dest.unlink(missing_ok=True)
                    return self._download_stream(digest, dest, size=size)
                try:
                    _check_range(resp, first, size, digest)
                except BaseException:
                    resp.close()
                    raise
                final = resp.url
                state.direct = final if final != url else None
                self._run_ranges(digest, url, fd, state, resp, plan, connections)
            state.hash_upto(fd, size)
            h = state.h
        finally:
            if fd >= 0:
                os.close(fd)
        if "sha256:" + h.hexdigest() != digest:
            _drop_ranges(dest)
            dest.unlink(missing_ok=True)
            if resumed:  # the bytes kept from before may be the bad ones: once more, from scratch
                return self._download_ranged(digest, dest, size=size, connections=connections)
            raise DigestMismatchError(f"blob {digest[7:19]}: downloaded content does not match its digest "
                                      f"({size} bytes in {len(plan)} ranges)", hint=HINT_DIGEST)
        _drop_ranges(dest)
        return resumed

    def _run_ranges(self, digest: str, url: str, fd: int, state: _RangeState, first: Any,
                    plan: list[tuple[int, int]], connections: int) -> None:
        """Workers take the planned ranges in order (the first one's answer already open); the
        first failure stops them all, what each wrote is recorded, and that failure is raised."""
        import queue

        todo: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        for r in plan[1:]:
            todo.put(r)

        def work(resp: Any, rng: tuple[int, int] | None) -> None:
            try:
                while not state.stop.is_set():
                    if rng is None:
                        try:
                            rng = todo.get_nowait()
                        except queue.Empty:
                            return
                        resp = self._range_answer(url, state, rng, size=state.size, digest=digest)
                    with resp:
                        self._copy_range(resp, fd, rng, state, digest)
                    state.finished(rng)
                    rng, resp = None, None
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                if resp is not None:
                    resp.close()
                state.fail(exc)
            finally:
                state.leave()

        threads = [threading.Thread(target=work, args=(first, plan[0]), daemon=True, name="ctxfarm-range-0")]
        threads += [threading.Thread(target=work, args=(None, None), daemon=True, name=f"ctxfarm-range-{i}")
                    for i in range(1, min(connections, len(plan)))]
        state.enter(len(threads))
        for t in threads:
            t.start()
        try:
            state.hash_while_running(fd)
        finally:
            state.stop.set()  # all written by now, or a failure (or an interrupt here): the rest stop
            for t in threads:
                t.join()
            state.save()
        if state.error is not None:
            raise state.error

    def _get_range(self, url: str, with_token: bool, rng: tuple[int, int]) -> Any:
        """GET bytes ``rng`` (start, end exclusive) of ``url`` through the guarded opener; the
        token only to the service itself."""
        headers = {"Accept": "*/*", "Range": f"bytes={rng[0]}-{rng[1] - 1}"}
        if with_token and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, headers=headers, method="GET")
        self._count(0, request=True)
        try:
            return _OPENER.open(req, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise _error_of(exc) from None
        except urllib.error.URLError as exc:
            raise ServerError(f"cannot reach {shown(urllib.parse.urlsplit(url).netloc)}: "
                              f"{clean_text(str(exc.reason), 200)}", hint=HINT_RESUME) from None
        except _WIRE_ERRORS as exc:
            raise ServerError(f"cannot reach {shown(urllib.parse.urlsplit(url).netloc)}: "
                              f"{clean_text(str(exc) or type(exc).__name__, 200)}", hint=HINT_RESUME) from None

    def _range_answer(self, url: str, state: _RangeState, rng: tuple[int, int], *, size: int, digest: str) -> Any:
        """A checked 206 for ``rng``: straight from where the service redirected the first range
        when it did; a refusal there (a presigned URL that expired) is asked once more of the
        service, which redirects afresh."""
        direct = state.direct
        try:
            resp = self._get_range(direct or url, direct is None, rng)
        except FarmError:
            if direct is None:
                raise
            resp = self._get_range(url, True, rng)
            final = resp.url
            state.direct = final if final != url else None
        try:
            if resp.status != 206:
                raise ServerError(f"blob {digest[7:19]}: the service answered HTTP {resp.status} to a request for "
                                  f"bytes {rng[0]}-{rng[1] - 1}, not 206 (partial content)", hint=HINT_SERVER)
            _check_range(resp, rng, size, digest)
        except BaseException:
            resp.close()
            raise
        return resp

    def _copy_range(self, resp: Any, fd: int, rng: tuple[int, int], state: _RangeState, digest: str) -> None:
        """Bytes ``rng`` of ``resp`` to the same offsets of ``fd``, not one past the range's end,
        each piece recorded as written."""
        pos, end = rng
        buf = bytearray(min(CHUNK, end - pos))
        view = memoryview(buf)
        try:
            while pos < end and not state.stop.is_set():
                n = resp.readinto(view[:min(len(buf), end - pos)])
                if not n:
                    break
                os.pwrite(fd, view[:n], pos)
                state.wrote(pos, pos + n)
                self._count(n)
                pos += n
        except _WIRE_ERRORS as exc:
            raise ServerError(f"blob {digest[7:19]}: the download broke off "
                              f"({clean_text(str(exc) or type(exc).__name__, 200)})", hint=HINT_RESUME) from None
        if pos < end and not state.stop.is_set():
            raise ServerError(f"blob {digest[7:19]}: the service sent {pos - rng[0]} of the {end - rng[0]} bytes "
                              f"asked at offset {rng[0]}", hint=HINT_RESUME)

    def _count(self, n: int, *, request: bool = False) -> None:
        with self._counted:
            self.received += n
            self.requests += request



# ---- ranged downloads: the plan, what is kept, the shared state of one blob's workers ------------

def merge_ranges(ranges: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """``ranges`` ([start, end) pairs) clipped to [0, size), sorted, empty ones dropped and
    overlapping or touching ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted((max(a, 0), min(b, size)) for a, b in ranges):
        if a >= b:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def plan_ranges(size: int, done: list[tuple[int, int]], part: int) -> list[tuple[int, int]]:
    """The bytes of [0, size) that ``done`` does not cover, as [start, end) ranges of at most
    ``part`` bytes, in file order (so the prefix a hasher waits for fills first)."""
    if part <= 0:
        raise ValueError("part must be positive")
    plan, pos = [], 0
    for a, b in [*merge_ranges(done, size), (size, size)]:
        while pos < a:
            plan.append((pos, min(pos + part, a)))
            pos = plan[-1][1]
        pos = max(pos, b)
    return plan


def _covered(ranges: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in ranges)


def _ranges_file(dest: Path) -> Path:
    return dest.with_name(dest.name + RANGES_SUFFIX)


def _drop_ranges(dest: Path) -> None:
    _ranges_file(dest).unlink(missing_ok=True)


def _load_ranges(dest: Path, size: int) -> list[tuple[int, int]]:
    """What ``dest`` holds of a blob of ``size`` bytes: the ranges its ``.ranges`` file records,
    or (none recorded: a one-stream download) its bytes from the start. A record that is not
    exactly the expected shape, or a file longer than the blob, keeps nothing (both removed):
    local files, but never trusted past what is checked here and by the digest at the end."""
    record = _ranges_file(dest)
    try:
        st = os.stat(dest, follow_symlinks=False)
    except FileNotFoundError:
        _drop_ranges(dest)
        return []
    if st.st_size > size:
        dest.unlink()
        _drop_ranges(dest)
        return []
    if not record.exists() and not record.is_symlink():
        return [(0, st.st_size)] if st.st_size else []
    try:
        if record.is_symlink() or record.stat().st_size > MAX_RANGES_BYTES:
            raise ValueError("not a ranges record")
        doc = json.loads(record.read_bytes())
        if not isinstance(doc, dict) or doc.get("size") != size or not isinstance(doc.get("done"), list):
            raise ValueError("another blob's record")
        ranges = []
        for r in doc["done"]:
            if not (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
                    and 0 <= r[0] < r[1] <= min(size, st.st_size)):
                raise ValueError("a range out of bounds")
            ranges.append((r[0], r[1]))
        return merge_ranges(ranges, size)
    except (OSError, ValueError, RecursionError):
        dest.unlink(missing_ok=True)
        _drop_ranges(dest)
        return []


def _kept_prefix(dest: Path, size: int) -> int:
    """The bytes at the start of ``dest`` that a one-stream download goes on from: its whole
    length, or where a ranged download left a hole (the file is cut there)."""
    done = _load_ranges(dest, size)
    have = done[0][1] if done and done[0][0] == 0 else 0
    if dest.exists() and dest.stat().st_size != have:
        os.truncate(dest, have)
    _drop_ranges(dest)
    return have


def kept_bytes(dest: Path, size: int) -> int:
    """How much of a blob of ``size`` bytes ``dest`` already holds (nothing is changed)."""
    try:
        st = os.stat(dest, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not os.path.isfile(dest) or st.st_size > size:
        return 0
    record = _ranges_file(dest)
    if not record.exists():
        return st.st_size
    try:
        doc = json.loads(record.read_bytes()[:MAX_RANGES_BYTES])
        return _covered(merge_ranges([(int(a), int(b)) for a, b in doc["done"]], min(size, st.st_size)))
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return 0


def _check_range(resp: Any, rng: tuple[int, int], size: int, digest: str) -> None:
    """A 206 for ``rng`` of a blob of ``size`` bytes: ``Content-Range`` exactly that range of
    exactly that size, and a ``Content-Length`` (when sent) of exactly the range's bytes."""
    want = f"bytes {rng[0]}-{rng[1] - 1}/{size}"
    got = (resp.headers.get("Content-Range") or "").strip()
    if resp.status != 206 or got != want:
        raise ServerError(f"blob {digest[7:19]}: asked for {want}, the service answered HTTP {resp.status} with "
                          f"Content-Range {shown(got, 60)}", hint=HINT_SERVER)
    _check_length(resp, rng[1] - rng[0], digest)


class _RangeState:
    """One blob's ranged download: the ranges written (shared by its workers and the hasher),
    the first failure, and the stop every worker checks between pieces."""

    def __init__(self, dest: Path, size: int, done: list[tuple[int, int]]):
        self.dest, self.size, self.done = dest, size, list(done)
        self.direct: str | None = None  # where the service redirected the first range
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.cond = threading.Condition()
        self.running = 0
        self.h = hashlib.sha256()
        self.hashed = 0

    def enter(self, n: int) -> None:
        with self.cond:
            self.running += n

    def leave(self) -> None:
        with self.cond:
            self.running -= 1
            self.cond.notify_all()

    def wrote(self, a: int, b: int) -> None:
        with self.cond:
            if self.done and self.done[-1][1] == a:
                self.done[-1] = (self.done[-1][0], b)  # the usual case: a range growing
            else:
                self.done = merge_ranges([*self.done, (a, b)], self.size)
            self.cond.notify_all()

    def finished(self, rng: tuple[int, int]) -> None:
        self.save()

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.stop.set()
            self.cond.notify_all()

    def save(self) -> None:
        """The ranges written so far, to the ``.ranges`` record beside the file (replaced whole:
        a kill leaves the previous record or this one)."""
        with self.cond:
            doc = {"size": self.size, "done": [list(r) for r in merge_ranges(self.done, self.size)]}
        record = _ranges_file(self.dest)
        tmp = record.with_name(record.name + f".{threading.get_ident()}")
        tmp.write_text(json.dumps(doc), encoding="utf-8")
        os.replace(tmp, record)

    def _prefix(self) -> int:
        for a, b in self.done:
            if a <= self.hashed < b:
                return b
        return self.hashed

    def hash_while_running(self, fd: int) -> None:
        """Hash the file in order as its prefix fills, until it is whole, a worker failed or
        every worker left."""
        while True:
            with self.cond:
                while (upto := self._prefix()) == self.hashed and self.error is None and self.running:
                    self.cond.wait(1.0)
                if self.error is not None or upto == self.hashed:
                    return
            self.hash_upto(fd, upto)
            if self.hashed >= self.size:
                return

    def hash_upto(self, fd: int, upto: int) -> None:
        while self.hashed < upto:
            data = os.pread(fd, min(4 * CHUNK, upto - self.hashed), self.hashed)
            if not data:
                raise ServerError(f"{self.dest.name}: the file being downloaded was cut short here",
                                  hint=HINT_RESUME)
            self.h.update(data)
            self.hashed += len(data)

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
            require_signature: bool = False, allow_unsigned: bool = False, timeout: float = 60.0,
            connections: int = CONNECTIONS) -> InstallResult:
    """Resolve, download (resuming), verify and place an artifact; see the module docstring.
    ``timeout``: seconds any network operation may wait (an answer's body gets twice that);
    ``connections``: how many ranges of one large file are fetched at once (1 to
    ``MAX_CONNECTIONS``; 1: one stream per file)."""
    if type(connections) is not int or not 1 <= connections <= MAX_CONNECTIONS:
        raise UsageError(f"connections {shown(connections)} is not a whole number from 1 to {MAX_CONNECTIONS}",
                         hint=f"e.g. --connections {CONNECTIONS}")
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
    files: list[dict[str, Any]] = manifest["files"]
    resumed, downloaded, kept = _fetch_and_place(client, out, files, connections=connections)
    return InstallResult(artifact, out / safe_relative(manifest["ctxModel"]),
                         [out / safe_relative(f["name"]) for f in files], sum(f["size"] for f in files), resumed,
                         signed_by, downloaded, kept, stages)


def _fetch_and_place(client: Client, out: Path, files: list[dict[str, Any]], *, connections: int,
                     directories: Sequence[str] = ()) -> tuple[int, int, int]:
    """Every file (``name``, ``digest``, ``size``: already checked) fetched by its digest into a
    staging folder beside ``out`` (each verified, resuming what an earlier try left), then the
    whole swapped into ``out`` atomically, with ``directories`` made even where empty. Files
    ``out`` already holds at their names are taken as they are (a hard link, no byte fetched) and
    verified like any download; when all are, and nothing else is there, nothing moves.
    Returns (bytes resumed, bytes received, bytes kept from ``out``)."""
    sizes = {f["digest"]: f["size"] for f in files}
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    if partial.is_symlink() or (partial.exists() and not partial.is_dir()):
        _remove(partial)
    partial.mkdir(exist_ok=True)
    reused = _take_placed(out, partial, files)
    _check_room(partial, files)
    resumed = kept = 0
    received = client.received
    for digest, size in sizes.items():
        # Named by the checked digest (64 hex digits), never by anything else the server said.
        got = client.download(digest, partial / digest[7:], size=size, connections=connections)
        if digest in reused and got == size:
            kept += size
        else:
            resumed += got
    downloaded = client.received - received
    if kept == sum(sizes.values()) and _holds_exactly(out, files, directories):
        # Up to date: every file verified where it is, nothing else there; nothing is moved.
        shutil.rmtree(partial, ignore_errors=True)
        return resumed, downloaded, kept
    with staged(out) as staging:
        for d in directories:
            inside(staging, d).mkdir(parents=True, exist_ok=True)
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
    shutil.rmtree(partial, ignore_errors=True)
    return resumed, downloaded, kept


def _placed(out: Path, name: str, is_kind: Any = stat_module.S_ISREG) -> Path | None:
    """``out/name`` where it is a regular file (``is_kind``: another ``stat`` test, e.g. a
    directory's) reached through no symlink, else None."""
    path = out / safe_relative(name)
    try:
        if inside(out, name) != out.resolve() / safe_relative(name) or path.resolve() != path:
            return None
        return path if is_kind(os.stat(path, follow_symlinks=False).st_mode) else None
    except (OSError, ValueError):
        return None


def _take_placed(out: Path, partial: Path, files: list[dict[str, Any]]) -> set[str]:
    """Hard-link into ``partial`` each file ``out`` already holds at its name with its declared
    size, where nothing is kept for its digest yet; the digests so taken. Not yet trusted: the
    download verifies them (a wrong one is fetched again)."""
    taken: set[str] = set()
    if not out.is_dir() or out.is_symlink():
        return taken
    for f in files:
        kept = partial / f["digest"][7:]
        if f["digest"] in taken or kept.exists() or kept.is_symlink():
            continue
        path = _placed(out, f["name"])
        if path is None or path.stat().st_size != f["size"]:
            continue
        try:
            os.link(path, kept)
        except OSError:
            continue  # another filesystem, a link limit: downloaded instead
        taken.add(f["digest"])
    return taken


def _holds_exactly(out: Path, files: list[dict[str, Any]], directories: Sequence[str] = ()) -> bool:
    """``out`` holds the manifest's files and nothing else (directories only on their paths and
    the ``directories`` asked for, each of those there), none a symlink, each the very file taken
    from it (checked by ``_take_placed``'s links: the same inode as the verified copy)."""
    want = {f["name"]: f["digest"] for f in files}
    asked = {"/".join(d.split("/")[:i]) for d in directories for i in range(1, d.count("/") + 2)}
    dirs = {"/".join(n.split("/")[:i]) for n in want for i in range(1, n.count("/") + 1)} | asked
    if any(_placed(out, d, stat_module.S_ISDIR) is None for d in directories):
        return False
    seen = 0
    for root, subdirs, names in os.walk(out):
        rel_root = Path(root).relative_to(out).as_posix()
        for d in subdirs:
            rel = d if rel_root == "." else f"{rel_root}/{d}"
            if rel not in dirs or os.path.islink(os.path.join(root, d)):
                return False
        for n in names:
            rel = n if rel_root == "." else f"{rel_root}/{n}"
            if rel not in want:
                return False
            seen += 1
    if seen != len(want):
        return False
    partial = out.parent / f".{out.name}{STAGING_MARK}{PARTIAL}"
    for name, digest in want.items():
        path = _placed(out, name)
        if path is None:
            return False
        a, b = os.stat(path, follow_symlinks=False), os.stat(partial / digest[7:], follow_symlinks=False)
        if (a.st_ino, a.st_dev) != (b.st_ino, b.st_dev):
            return False
    return True


def _check_room(partial: Path, files: list[dict[str, Any]]) -> None:
    """Declared sizes that the device's disk can't hold are refused before a byte is fetched (a
    server can't fill a device by declaring a terabyte); files placed are hard links of the
    downloads, so the artifact needs its size once."""
    need = 0
    for digest, size in {f["digest"]: f["size"] for f in files}.items():
        need += max(size - kept_bytes(partial / digest[7:], size), 0)
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
    p.add_argument("--model", "-m", help="NAME:TAG, NAME or a model digest")
    p.add_argument("--package", metavar="NAME:TAG",
                   help="instead of --model: the ORT model package of NAME:TAG (every variant; onnxruntime >= 1.32 "
                        "picks one)")
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
    p.add_argument("--connections", type=int, default=CONNECTIONS, metavar="N",
                   help=f"ranges of one large file fetched at once (1 to {MAX_CONNECTIONS}, default {CONNECTIONS})")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    env = os.environ
    try:
        from farm.core.settings import parse_bool, parse_trusted_keys

        if not args.server:
            raise UsageError("ctxfarm-install needs --server (or FARM_SERVER)", hint="e.g. --server http://farm:8080")
        if bool(args.model) == bool(args.package):
            raise UsageError("ctxfarm-install needs --model NAME:TAG or --package NAME:TAG, one of them")
        policy = {"trusted_keys": list(parse_trusted_keys(env.get("FARM_TRUSTED_KEYS", ""))),
                  "require_signature": args.require_signature
                  or parse_bool("FARM_REQUIRE_SIGNATURE", env.get("FARM_REQUIRE_SIGNATURE")),
                  "allow_unsigned": args.allow_unsigned or parse_bool("FARM_ALLOW_UNSIGNED", env.get("FARM_ALLOW_UNSIGNED")),
                  "timeout": args.timeout}
        if args.package:
            result = install_package(args.server, args.token, args.package, dest=args.dest,
                                     connections=args.connections, **policy)
        else:
            qnn = detect_qnn() if args.detect else args.qnn
            result = install(args.server, args.token, args.model, dest=args.dest, soc=args.soc, qnn=qnn,
                             gpu=args.gpu, trt=args.trt, platform=args.platform, connections=args.connections,
                             **policy)
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
                          "resumed_bytes": result.resumed_bytes, "downloaded_bytes": result.downloaded_bytes,
                          "reused_bytes": result.reused_bytes, "signed_by": result.signed_by}, indent=2))
    else:
        print(str(result.ctx_model))
    return 0


def install_package_files(client: Client, digest: str, size: int, dest: Path, *, trusted: Any = (),
                          signatures: list[dict[str, str]] | None = None, required: bool = False,
                          allow_unsigned: bool = False, connections: int = CONNECTIONS) -> InstallResult:
    """An ORT model package (``farm package --server``, issue 30) into ``dest``: its record
    fetched by ``digest`` (at most ``size`` bytes, checked against the digest), the signature
    policy applied to that digest, then every file it lists fetched by its digest (each size
    and sha256 verified, resuming) and the whole swapped into place atomically. The result's
    ``ctx_model`` is the package's ``manifest.json`` (``ModelPackageContext`` opens its folder)."""
    from farm.core.packages import MANIFEST, check_record

    if not is_digest(digest) or not isinstance(size, int) or not 0 < size <= MAX_ANSWER_BYTES:
        raise ServerError("the package answer names no valid record", hint=HINT_SERVER)
    data = client.manifest_bytes(digest, size)
    try:
        doc = check_record(_parse_json(data, f"package {digest[7:19]}", ManifestError))
    except ManifestError as exc:
        raise ManifestError(exc.message, hint=HINT_SERVER) from None
    signed_by = _check_signatures(digest, signatures or [], list(trusted or []), required=required,
                                  allow_unsigned=allow_unsigned)
    out = destination(Path(dest))
    files = [{"name": f["path"], "digest": f["digest"], "size": f["size"]} for f in doc["files"]]
    # As an artifact's files: a large variant in parallel ranges, files already in place kept.
    resumed, downloaded, kept = _fetch_and_place(client, out, files, connections=connections,
                                                 directories=doc["directories"])
    return InstallResult(digest, out / MANIFEST, [out / safe_relative(f["name"]) for f in files],
                         sum(int(f["size"]) for f in files), resumed, signed_by, downloaded, kept)


def install_package(server: str, token: str | None, ref: str, *, dest: str | os.PathLike[str],
                    trusted_keys: list[str] | None = None, require_signature: bool = False,
                    allow_unsigned: bool = False, timeout: float = 60.0, connections: int = CONNECTIONS
                    ) -> InstallResult:
    """``farm install --package NAME:TAG``: the newest ORT model package made of NAME:TAG's
    current model (``GET /v1/packages?ref=``, a read token: it makes nothing), installed as
    ``install_package_files`` does."""
    client = Client(server, token, timeout=timeout)
    answer = client.json("GET", "/v1/packages", ref=ref)
    if not isinstance(answer, dict) or not isinstance(answer.get("record_size"), int):
        raise ServerError("the package answer is not a JSON object with a record_size", hint=HINT_SERVER)
    sigs = answer.get("signatures") if isinstance(answer.get("signatures"), list) else []
    return install_package_files(client, str(answer.get("digest")), answer["record_size"], Path(dest),
                                 trusted=trusted_keys or [], signatures=sigs, required=require_signature,
                                 allow_unsigned=allow_unsigned, connections=connections)


if __name__ == "__main__":
    sys.exit(main())
