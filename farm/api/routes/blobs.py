"""Blobs: ``GET /v1/blobs/DIGEST`` (read), with Range, ETag and presigned redirects."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import RedirectResponse, Response, StreamingResponse

from farm.api.answers import none_match
from farm.api.deps import MetricsDep, RegistryDep, read
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
