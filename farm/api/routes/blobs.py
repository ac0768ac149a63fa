"""Blobs: ``GET /v1/blobs/DIGEST`` (read), with Range, ETag and presigned redirects;
``HEAD /v1/blobs/DIGEST`` (read: whether the service holds it) and ``PUT /v1/blobs/DIGEST``
(submit: one file by its digest, for ``POST /v1/genai`` and for a model recorded from held blobs,
``POST /v1/models/DIGEST`` with its files: a file goes up once per digest, whoever sent it)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from farm.api.answers import none_match
from farm.api.deps import (
    Caller,
    MetricsDep,
    RegistryDep,
    SettingsDep,
    drain,
    read,
    receive_body,
    submit_before_body,
    submitter,
    uploads_dir,
)
from farm.api.schemas import ErrorResponse
from farm.core import errors as E
from farm.core.keys import is_digest
from registry.index import Registry

router = APIRouter(tags=["read"])


@router.get("/v1/blobs/{digest}", dependencies=[read],
            responses={200: {"content": {"application/octet-stream": {}}}, 206: {}, 304: {}, 307: {}})
def get_blob(digest: str, reg: RegistryDep, metrics: MetricsDep,
             range_: Annotated[str | None, Header(alias="range")] = None,
             if_none_match: Annotated[str | None, Header()] = None,
             accept_encoding: Annotated[str | None, Header()] = None) -> Response:
    if not is_digest(digest):
        raise E.UsageError(f"{digest[:80]!r} is not a sha256 digest")
    etag = f'"{digest}"'
    # Weak comparison (RFC 9110 13.1.2), as resolve: W/"d" matches "d"; "*" matches a blob that
    # exists, so it is answered after the stat (a missing blob stays 404).
    star = bool(if_none_match) and "*" in [t.strip() for t in (if_none_match or "").split(",")]
    if not star and none_match(if_none_match, etag):
        return Response(status_code=304, headers={"ETag": etag})
    presign = getattr(reg.store, "presign", None)
    info = reg.store.stat(digest)
    if star:
        return Response(status_code=304, headers={"ETag": etag})
    # A blob the store holds compressed (one part at most: S3BlobStore) goes straight from S3
    # only to a client that takes that Content-Encoding, whole; any other gets it decoded here.
    if presign is not None and (info.encoding is None
                                or (not range_ and _accepts(accept_encoding, info.encoding))):
        return RedirectResponse(presign(digest, 3600), status_code=307, headers={"ETag": etag})
    return _ranged(reg, digest, info.size, range_, etag, metrics)


def _accepts(accept_encoding: str | None, coding: str) -> bool:
    """Whether an Accept-Encoding header takes ``coding`` (named, or ``*``, with q above 0)."""
    for item in (accept_encoding or "").split(","):
        name, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=").strip() if params.strip().startswith("q=") else "1"
        try:
            weight = float(q)
        except ValueError:
            continue
        if name.strip().lower() in (coding, "*") and weight > 0:
            return True
    return False


def _ranged(reg: Registry, digest: str, size: int, range_: str | None, etag: str, metrics: Any) -> Response:
    start, end = 0, size - 1
    status = 200
    if range_:
        spec = range_.strip().removeprefix("bytes=")
        first, _, last = spec.partition("-")
        try:
            if first:
                start = int(first)
                end = int(last) if last else size - 1
            else:
                start = max(size - int(last), 0)
            if start > end or start >= size:
                raise ValueError
        except ValueError:
            return Response(status_code=416, headers={"Content-Range": f"bytes */{size}", "ETag": etag})
        end = min(end, size - 1)
        status = 206

    def body() -> Iterator[bytes]:
        left = end - start + 1
        with reg.store.open(digest) as f:
            if start:
                seek = getattr(f, "seek", None)
                if seek is not None:
                    seek(start)
                else:
                    skip = start
                    while skip:
                        skip -= len(f.read(min(skip, 1 << 20)))
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
                metrics.bytes_served.inc(len(chunk))
                yield chunk

    headers = {"ETag": etag, "Accept-Ranges": "bytes", "Content-Length": str(end - start + 1)}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return StreamingResponse(body(), status_code=status, media_type="application/octet-stream", headers=headers)


# ---- a file by its digest: asked for first, sent only when the service lacks it ----------------

@router.head("/v1/blobs/{digest}", dependencies=[read], responses={200: {}, 404: {}})
def held_blob(digest: str, reg: RegistryDep) -> Response:
    """200 (``Content-Length``: its size) when the store holds the blob, else 404: as an OCI
    registry answers ``HEAD /v2/.../blobs/DIGEST`` before a push. Never redirected."""
    from farm.core.errors import BlobNotFound

    if not is_digest(digest):
        raise E.UsageError(f"{digest[:80]!r} is not a sha256 digest")
    try:
        size = reg.store.stat(digest).size
    except BlobNotFound:
        raise E.NotFoundError(f"the service does not hold blob {digest}",
                              hint=f"send it: PUT /v1/blobs/{digest}") from None
    return Response(status_code=200, headers={"ETag": f'"{digest}"', "Content-Length": str(size)})


class BlobOut(BaseModel):
    digest: str
    size: int
    held: bool = Field(description="true: the service held it already (the body was not stored again)")


def _upload_limit(request: Request) -> int:
    return int(request.app.state.settings.max_upload_mb) * 1024 * 1024


@router.put("/v1/blobs/{digest}", response_model=BlobOut, tags=["submit"],
            dependencies=[submit_before_body(_upload_limit)],
            responses={429: {"model": ErrorResponse, "description": "quota-upload-bytes: this token's open upload "
                                                                    "sessions and unreferenced blobs would hold over "
                                                                    "FARM_QUOTA_UPLOAD_MB"}})
async def put_blob(digest: str, request: Request, settings: SettingsDep, reg: RegistryDep,
                   metrics: MetricsDep, who: Annotated[Caller, submitter]) -> BlobOut:
    """Store the body as the blob ``digest``: streamed to disk (at most FARM_MAX_UPLOAD_MB,
    else 413 ``too-large``), hashed, stored only when it hashes to ``digest`` (else 400
    ``usage``, nothing stored). Idempotent: a blob the service holds is not stored again. What
    the token stored this way and no model references yet counts against its
    FARM_QUOTA_UPLOAD_MB with its upload sessions, for FARM_UPLOAD_TTL_S (429
    ``quota-upload-bytes``, nothing stored): its declared size (Content-Length) is taken from the
    quota before the body is read, and given back if the body fails (a body without a declared
    size takes what is free, up to the cap, and gives back what it did not bring); recording any
    model that holds it (a genai package and its parts too) frees it. A blob nothing comes to
    reference is removed by ``farm registry gc`` after its grace window, as any unreferenced blob."""
    from starlette.concurrency import run_in_threadpool

    from farm.api import quotas
    from farm.core.errors import BlobNotFound
    from registry.store.base import put_file

    limit = _upload_limit(request)
    if not is_digest(digest):
        await drain(request, limit)
        raise E.UsageError(f"{digest[:80]!r} is not a sha256 digest", hint="sha256: and 64 lowercase hex digits")
    # The guard refused a declared size that is not a number or is over the cap.
    declared = int(request.headers["content-length"]) if "content-length" in request.headers else None
    try:
        held = await run_in_threadpool(reg.store.stat, digest)
    except BlobNotFound:
        held = None
    if held is not None:
        await drain(request, limit)  # the same bytes: nothing to store
        return BlobOut(digest=digest, size=int(held.size), held=True)
    try:
        row, room = await run_in_threadpool(quotas.take_for_blob, settings, reg, who.token_id, digest, declared, limit)
    except E.QuotaUploadBytesError:
        await drain(request, limit)
        raise
    stored = False
    work = Path(tempfile.mkdtemp(prefix="upload-", dir=uploads_dir(settings)))
    hasher = hashlib.sha256()
    try:
        try:
            size = await receive_body(request, work / "blob", room, f"the blob is over {settings.max_upload_mb} MiB",
                                      hasher)
        except E.TooLargeError as exc:
            if declared is None and room < limit:
                raise quotas.over_quota(settings) from None
            exc.hint = "a file goes up in one request: raise FARM_MAX_UPLOAD_MB on the service for larger ones"
            raise
        metrics.bytes_received.inc(size)
        if declared is not None and declared != size:
            raise E.UsageError(f"the blob was cut short ({size} of {declared} bytes)", hint="send it again")
        got = "sha256:" + hasher.hexdigest()
        if got != digest:
            raise E.UsageError(f"the body hashes to {got}, not to the digest it was sent as ({digest})",
                               hint="PUT /v1/blobs/<sha256 of the body>")
        await run_in_threadpool(put_file, reg.store, work / "blob", expected=digest)
        stored = True
        await run_in_threadpool(quotas.settle_blob, reg, row, size)
        return BlobOut(digest=digest, size=size, held=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if not stored:  # a failed body (cut, too long, another digest): its room is free again
            import anyio

            with anyio.CancelScope(shield=True):
                await run_in_threadpool(quotas.give_back_blob, reg, row)
