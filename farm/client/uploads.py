"""Uploads, the pipeline's side of the client: a model bundle streamed as one request (a tar
made as it is sent, the same bytes every time), or through an upload session that survives a
cut connection; hash first, so what the service already holds is never sent again.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.client import shapes
from farm.client.transport import HINT_SERVER, MAX_ANSWER_BYTES, Stream, Transport, parse_json, read_capped
from farm.core.errors import FarmError, ServerError
from farm.core.untrusted import shown


def tar_parts(members: list[tuple[str, Path]]) -> tuple[list[tuple[bytes | None, Path | None, int]], int]:
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
    """An upload session id kept from an earlier call: 32 hex digits, or it is refused (it goes
    into a URL path)."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{32}", value):
        raise ServerError(f"upload session id {shown(value)} is not 32 hex digits", hint=HINT_SERVER)
    return value


class Uploads(Transport):
    """The upload requests of ``farm.client.Client``."""

    def upload(self, path: Path, *, name: str | None = None, tag: str | None = None,
               force_tag: bool = False) -> dict[str, Any]:
        kinds = {".onnx": "application/octet-stream", ".tar": "application/x-tar", ".gz": "application/gzip",
                 ".tgz": "application/gzip", ".zip": "application/zip"}
        size = path.stat().st_size
        return self._post_model(Stream([(None, path, size)]), size,
                                kinds.get(path.suffix.lower(), "application/octet-stream"), name, tag, force_tag)

    def _post_model(self, body: Stream, size: int, content_type: str, name: str | None, tag: str | None,
                    force_tag: bool) -> dict[str, Any]:
        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        with self._request("POST", "/v1/models", body=body, headers=headers,
                           query={"name": name, "tag": tag, "force_tag": "true" if force_tag else None}) as resp:
            answer = parse_json(read_capped(resp, MAX_ANSWER_BYTES, "the upload's answer",
                                            deadline=time.monotonic() + 2 * self.timeout),
                                "the upload's answer", ServerError)
        return shapes.conform(answer, shapes.Obj(), "the upload's answer", ServerError, HINT_SERVER)

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
        shapes.conform(answer, shapes.STORED, "the answer to a held-model request", ServerError, HINT_SERVER)
        if answer["digest"] != digest:
            raise ServerError("the answer to a held-model request names another model", hint=HINT_SERVER)
        return answer

    def upload_bundle(self, members: list[tuple[str, Path]], *, name: str | None = None, tag: str | None = None,
                      force_tag: bool = False) -> dict[str, Any]:
        """Upload a model bundle: a lone .onnx as it is; with external data, a tar of (name,
        file) written as it is sent, 1 MiB at a time, its length known before the first byte:
        memory stays flat whatever the size."""
        if len(members) == 1:
            return self.upload(members[0][1], name=name, tag=tag, force_tag=force_tag)
        parts, total = tar_parts(members)
        return self._post_model(Stream(parts), total, "application/x-tar", name, tag, force_tag)

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
            parts, total = tar_parts(members)
            kind = "application/x-tar"
        offset = 0
        if session is not None:
            try:
                where = self.json("GET", f"/v1/uploads/{_session_id(session)}")
                offset = shapes.conform(where, shapes.UPLOAD_OFFSET, "the upload session's answer", ServerError,
                                        HINT_SERVER)["offset"]
            except FarmError:  # gone, or an answer refused: a new session
                session = None
        if session is None or offset > total:
            from farm.core.errors import NotFoundError

            try:
                answer = self.json("POST", "/v1/uploads")
            except NotFoundError:  # a service without upload sessions: one request, not resumable
                return self.upload_bundle(members, name=name, tag=tag, force_tag=force_tag)
            shapes.conform(answer, shapes.UPLOAD_SESSION, "the answer to a new upload session", ServerError,
                           HINT_SERVER)
            session, offset = answer["upload"], 0
            if on_session is not None:
                on_session(session)
        if offset < total:
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(total - offset),
                       "Upload-Offset": str(offset)}
            with self._request("PATCH", f"/v1/uploads/{session}", body=Stream(parts, skip=offset),
                               headers=headers) as resp:
                read_capped(resp, MAX_ANSWER_BYTES, "the upload's answer",
                            deadline=time.monotonic() + 2 * self.timeout)
        answer = self.json("POST", f"/v1/uploads/{session}/complete", None, name=name, tag=tag,
                           force_tag="true" if force_tag else None, bundle_type=kind)
        return shapes.conform(answer, shapes.Obj(), "the upload's answer", ServerError, HINT_SERVER)

    def blob_held(self, digest: str) -> bool:
        """Hash first, one file: ``HEAD /v1/blobs/DIGEST`` (200: the service holds it)."""
        from farm.core.errors import NotFoundError

        try:
            with self._request("HEAD", f"/v1/blobs/{urllib.parse.quote(digest)}"):
                return True
        except NotFoundError:
            return False  # a HEAD answer has no body: transport names it by its status

    def put_blob(self, path: Path, digest: str, size: int) -> dict[str, Any]:
        """``PUT /v1/blobs/DIGEST``: the file, streamed 1 MiB at a time (the service hashes it and
        stores it only under the digest it hashes to)."""
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        with self._request("PUT", f"/v1/blobs/{urllib.parse.quote(digest)}", body=Stream([(None, path, size)]),
                           headers=headers) as resp:
            answer = parse_json(read_capped(resp, MAX_ANSWER_BYTES, "the blob upload's answer",
                                            deadline=time.monotonic() + 2 * self.timeout),
                                "the blob upload's answer", ServerError)
        shapes.conform(answer, shapes.STORED, "the answer to a blob upload", ServerError, HINT_SERVER)
        if answer["digest"] != digest:
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

