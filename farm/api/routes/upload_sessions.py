"""Resumable uploads: an upload session that takes the bundle in pieces and survives a cut
connection, as an OCI registry's blob upload does (``POST``, ``PATCH``…, then complete).

    POST  /v1/uploads                         -> 201 {"upload": ID, "offset": 0}
    GET   /v1/uploads/ID                      -> {"upload": ID, "offset": N}   (where to go on from)
    PATCH /v1/uploads/ID   Upload-Offset: N   -> {"upload": ID, "offset": M}   (append; N must be the offset)
    POST  /v1/uploads/ID/complete?name&tag    -> the ModelOut of ``POST /v1/models`` (Content-Type: the bundle's)

A session is a directory ``FARM_HOME/uploads/session-ID`` whose name is the server's own random
hex id (never the client's), checked by shape before any path is made, and a row of
``upload_sessions`` naming the token that opened it: only that token (or an admin) reads, appends
to or completes it; to any other token it does not exist (404 ``not-found``, as an unknown id). A
PATCH at another offset is refused (``usage``, naming the offset to resume from), so is a second
request on a session while one writes it. Per token: at most ``FARM_QUOTA_UPLOADS`` open sessions
(429 ``quota-uploads``) holding at most ``FARM_QUOTA_UPLOAD_MB`` together (429
``quota-upload-bytes``); per service at most ``MAX_SESSIONS`` (429 ``rate-limited``). One upload
is capped at FARM_MAX_UPLOAD_MB (413 ``too-large``); sessions untouched for ``FARM_UPLOAD_TTL_S``
expire (rows and bytes removed) whenever a session starts.
"""

from __future__ import annotations

import asyncio
import fcntl
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from farm.api import quotas
from farm.api.deps import Caller, MetricsDep, RegistryDep, SettingsDep, drain, submit_before_body, submitter, uploads_dir
from farm.api.schemas import ModelOut
from farm.core import errors as E
from farm.core.names import inside
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

router = APIRouter(tags=["submit"])

SESSION_RE = re.compile(r"[0-9a-f]{32}")
MAX_SESSIONS = 64  # open at once, per service (each token: FARM_QUOTA_UPLOADS)


def _limit(request: Request) -> int:
    return int(request.app.state.settings.max_upload_mb) * 1024 * 1024


def _session(settings: Settings, reg: Registry, upload: str, who: Caller) -> Path:
    """The session's directory, when ``who`` owns it (or is an admin); else 404 as for no session:
    another token's upload is not this token's business, not even that it exists."""
    return _owned(settings, reg, upload, who)[0]


def _owned(settings: Settings, reg: Registry, upload: str, who: Caller) -> tuple[Path, int]:
    """``_session``, and the token that owns it (whose quota it counts against)."""
    from registry.models import UploadSession

    missing = E.NotFoundError(f"no upload session {upload[:40]!r}", hint="it expired or completed (or was never "
                                                                        "this token's): start one with POST /v1/uploads")
    if not SESSION_RE.fullmatch(upload):
        raise missing
    with reg.db.session() as s:
        row = s.get(UploadSession, upload)
        if row is None or (row.owner_token_id != who.token_id and not who.admin):
            raise missing
        owner = int(row.owner_token_id)
    d = inside(uploads_dir(settings), f"session-{upload}")
    if not (d / "data").is_file():
        raise missing
    return d, owner


@contextmanager
def _exclusive(d: Path) -> Iterator[None]:
    """One request at a time on a session: two appends at the same offset would interleave."""
    with open(d / "lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise E.UsageError(f"upload {d.name.removeprefix('session-')} is being written by another request",
                               hint="one piece at a time: wait for it, then GET the offset") from None
        yield


def _sweep(settings: Settings, reg: Registry) -> None:
    """Expire the sessions untouched for FARM_UPLOAD_TTL_S: their rows and their bytes (and any
    directory without a row, as old)."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy import delete, select

    from registry.models import UploadSession

    root = uploads_dir(settings)
    cutoff = datetime.now(UTC) - timedelta(seconds=settings.upload_ttl_s)
    with reg.db.session() as s:
        gone = list(s.scalars(select(UploadSession.id).where(UploadSession.touched_at < cutoff)))
        if gone:
            s.execute(delete(UploadSession).where(UploadSession.id.in_(gone)))
        live = set(s.scalars(select(UploadSession.id)))
    for d in root.glob("session-*"):
        upload = d.name.removeprefix("session-")
        try:
            stale = upload in gone or (upload not in live and d.stat().st_mtime < cutoff.timestamp())
        except OSError:
            continue
        if stale:
            shutil.rmtree(d, ignore_errors=True)


def _open(settings: Settings, reg: Registry, who: Caller) -> str:
    from sqlalchemy import func, select

    from registry.models import UploadSession

    _sweep(settings, reg)
    # Counted and opened as one step per token: two requests at once cannot both pass the quota;
    # and, for MAX_SESSIONS, as one step across tokens (their locks differ).
    with reg.db.serialized("uploads", who.token_id), reg.db.session() as s:
        _across_tokens(s)
        mine = s.scalar(select(func.count()).where(UploadSession.owner_token_id == who.token_id)) or 0
        if mine >= settings.quota_uploads:
            raise E.QuotaUploadsError(f"this token holds {mine} open upload sessions (FARM_QUOTA_UPLOADS="
                                      f"{settings.quota_uploads})")
        if (s.scalar(select(func.count()).select_from(UploadSession)) or 0) >= MAX_SESSIONS:
            raise E.RateLimitedError(f"{MAX_SESSIONS} upload sessions are open on this service",
                                     hint="wait for the open ones to complete or expire, then start again")
        upload = secrets.token_hex(16)
        s.add(UploadSession(id=upload, owner_token_id=who.token_id, size=0))
    d = uploads_dir(settings) / f"session-{upload}"
    d.mkdir()
    (d / "data").touch()
    return upload


def _across_tokens(s: Any) -> None:
    """The service's count of open sessions and the new one as one step, whatever the token:
    PostgreSQL, a transaction-level advisory lock (released at commit; taken on the session's own
    connection, so no second pooled connection waits for it), waited for 10 s at most (429
    ``rate-limited``); SQLite, the session's BEGIN IMMEDIATE already has writers take turns."""
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    if s.get_bind().dialect.name != "postgresql":
        return
    s.execute(text("SET LOCAL lock_timeout = '10s'"))
    try:
        s.execute(text("SELECT pg_advisory_xact_lock(hashtext('ctxfarm.upload-sessions'), 0)"))
    except OperationalError:
        raise E.RateLimitedError("upload sessions are being opened by many requests right now",
                                 hint="try again in a moment") from None


@router.post("/v1/uploads", status_code=201)
def start_upload(settings: SettingsDep, reg: RegistryDep, who: Annotated[Caller, submitter]) -> dict[str, Any]:
    """Open an upload session owned by this token (its quotas: FARM_QUOTA_UPLOADS sessions,
    FARM_QUOTA_UPLOAD_MB held)."""
    return {"upload": _open(settings, reg, who), "offset": 0}


@router.get("/v1/uploads/{upload}")
def upload_offset(upload: str, settings: SettingsDep, reg: RegistryDep,
                  who: Annotated[Caller, submitter]) -> dict[str, Any]:
    return {"upload": upload, "offset": (_session(settings, reg, upload, who) / "data").stat().st_size}


def _record(reg: Registry, upload: str, size: int) -> None:
    from datetime import UTC, datetime

    from sqlalchemy import update

    from registry.models import UploadSession

    with reg.db.session() as s:
        s.execute(update(UploadSession).where(UploadSession.id == upload)
                  .values(size=size, touched_at=datetime.now(UTC)))


@router.patch("/v1/uploads/{upload}", dependencies=[submit_before_body(_limit)])
async def append_upload(upload: str, request: Request, settings: SettingsDep, reg: RegistryDep,
                        metrics: MetricsDep, who: Annotated[Caller, submitter],
                        upload_offset: Annotated[int, Header(ge=0)]) -> dict[str, Any]:
    """Append the body at ``Upload-Offset`` (which must be what the session holds). The piece's
    declared size (else what is free, up to the cap) is taken from the owner's bytes quota before
    it is read (``farm.api.quotas``); the session then holds what it holds, however the piece ended."""
    from starlette.concurrency import run_in_threadpool

    limit = _limit(request)
    try:
        d, owner = await run_in_threadpool(_owned, settings, reg, upload, who)
        with _exclusive(d):
            try:
                have = _piece_fits(request, settings, upload, d / "data", upload_offset, limit)
                declared = request.headers.get("content-length", "")
                room = have + await run_in_threadpool(quotas.take_for_piece, settings, reg, owner, upload, have,
                                                      int(declared) if declared.isdigit() else None, limit)
                return await _append(request, settings, upload, d / "data", upload_offset, limit, room,
                                     metrics.bytes_received.inc)
            finally:
                # What the session holds now, however the piece ended (a cut connection keeps
                # what arrived): the quota counts it (the room the piece did not fill is free
                # again), and the session was touched.
                import anyio

                with anyio.CancelScope(shield=True):
                    await run_in_threadpool(_record, reg, upload, (d / "data").stat().st_size)
    except E.FarmError:
        await drain(request, limit)
        raise


def _piece_fits(request: Request, settings: Settings, upload: str, data: Path, upload_offset: int,
               limit: int) -> int:
    """What the session holds, when the piece starts there and its declared size stays under the cap."""
    have = data.stat().st_size
    if upload_offset != have:
        raise E.UsageError(f"upload {upload} holds {have} bytes, the piece starts at {upload_offset}",
                           hint=f"GET /v1/uploads/{upload} says where to go on from")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and have + int(declared) > limit:
        raise E.TooLargeError(f"the upload is over {settings.max_upload_mb} MiB")
    return have


async def _append(request: Request, settings: Settings, upload: str, data: Path, upload_offset: int,
                  limit: int, room: int, received: Any = None) -> dict[str, Any]:
    """The piece appended, up to ``room`` bytes held in all (the room taken for it): past it the
    piece is refused whole."""
    have = _piece_fits(request, settings, upload, data, upload_offset, limit)
    over_quota = quotas.over_quota(settings)
    size = have
    with open(data, "ab") as f:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if received is not None:
                    received(len(chunk))
                if size > limit or size > room:
                    f.truncate(have)  # the piece is refused whole
                    if size > limit:
                        raise E.TooLargeError(f"the upload is over {settings.max_upload_mb} MiB")
                    raise over_quota
                f.write(chunk)
        except E.FarmError:
            raise
        except Exception:
            f.flush()  # a cut connection: what arrived stays; the client resumes from there
            raise
    return {"upload": upload, "offset": size}


@router.post("/v1/uploads/{upload}/complete", response_model=ModelOut)
async def complete_upload(upload: str, request: Request, settings: SettingsDep, reg: RegistryDep,
                          who: Annotated[Caller, submitter],
                          name: Annotated[str | None, Query(max_length=255)] = None,
                          tag: Annotated[str | None, Query(max_length=128)] = None,
                          force_tag: bool = False,
                          bundle_type: Annotated[str, Query(max_length=64)] = "application/x-tar") -> ModelOut:
    """The session's bytes as one ``POST /v1/models`` body of type ``bundle_type``; the session
    is gone afterwards, whatever the answer."""
    from starlette.concurrency import run_in_threadpool

    from farm.api.routes.models import UNPACKERS, _accept_upload

    name_, tag_ = plan.check_name_tag(name, tag)
    d = await run_in_threadpool(_session, settings, reg, upload, who)
    with _exclusive(d):
        try:
            # On the uploads' own threads, as POST /v1/models: never in front of resolve.
            return await asyncio.get_running_loop().run_in_executor(
                UNPACKERS, _accept_upload, settings, reg, d / "data", bundle_type, d / "bundle", _limit(request),
                name_, tag_, force_tag)
        finally:
            shutil.rmtree(d, ignore_errors=True)
            await run_in_threadpool(_forget, reg, upload)


def _forget(reg: Registry, upload: str) -> None:
    from sqlalchemy import delete

    from registry.models import UploadSession

    with reg.db.session() as s:
        s.execute(delete(UploadSession).where(UploadSession.id == upload))
