"""Resumable uploads: an upload session that takes the bundle in pieces and survives a cut
connection, as an OCI registry's blob upload does (``POST``, ``PATCH``…, then complete).

    POST  /v1/uploads                         -> 201 {"upload": ID, "offset": 0}
    GET   /v1/uploads/ID                      -> {"upload": ID, "offset": N}   (where to go on from)
    PATCH /v1/uploads/ID   Upload-Offset: N   -> {"upload": ID, "offset": M}   (append; N must be the offset)
    POST  /v1/uploads/ID/complete?name&tag    -> the ModelOut of ``POST /v1/models`` (Content-Type: the bundle's)

A session is a directory ``FARM_HOME/uploads/session-ID`` whose name is the server's own random
hex id (never the client's), checked by shape before any path is made. A PATCH at another offset
is refused (``usage``, naming the offset to resume from), so is a second request on a session
while one writes it; at most ``MAX_SESSIONS`` are open (``rate-limited``); the total is capped at
FARM_MAX_UPLOAD_MB; sessions untouched for ``SESSION_TTL_S`` are removed when a new one starts.
"""

from __future__ import annotations

import asyncio
import fcntl
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from farm.api.deps import RegistryDep, SettingsDep, drain, submit, submit_before_body
from farm.api.schemas import ModelOut
from farm.core import errors as E
from farm.core.names import inside
from farm.core.settings import Settings
from farm.pipeline import plan

router = APIRouter(tags=["submit"])

SESSION_RE = re.compile(r"[0-9a-f]{32}")
SESSION_TTL_S = 24 * 3600.0
MAX_SESSIONS = 64  # open at once, per service: each may hold up to FARM_MAX_UPLOAD_MB on disk


def _limit(request: Request) -> int:
    return int(request.app.state.settings.max_upload_mb) * 1024 * 1024


def _root(settings: Settings) -> Path:
    d = settings.home / "uploads"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _session(settings: Settings, upload: str) -> Path:
    if not SESSION_RE.fullmatch(upload):
        raise E.NotFoundError(f"no upload session {upload[:40]!r}", hint="start one: POST /v1/uploads")
    d = inside(_root(settings), f"session-{upload}")
    if not (d / "data").is_file():
        raise E.NotFoundError(f"no upload session {upload}", hint="it expired or completed: start one with "
                                                                  "POST /v1/uploads")
    return d


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


def _sweep(root: Path) -> None:
    cutoff = time.time() - SESSION_TTL_S
    for d in root.glob("session-*"):
        try:
            if (d / "data").stat().st_mtime < cutoff:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue


@router.post("/v1/uploads", status_code=201, dependencies=[submit])
def start_upload(settings: SettingsDep) -> dict[str, Any]:
    root = _root(settings)
    _sweep(root)
    if len(list(root.glob("session-*"))) >= MAX_SESSIONS:
        raise E.RateLimitedError(f"{MAX_SESSIONS} upload sessions are open on this service",
                                 hint="complete or let expire the open ones (a day untouched), then start again")
    upload = secrets.token_hex(16)
    d = root / f"session-{upload}"
    d.mkdir()
    (d / "data").touch()
    return {"upload": upload, "offset": 0}


@router.get("/v1/uploads/{upload}", dependencies=[submit])
def upload_offset(upload: str, settings: SettingsDep) -> dict[str, Any]:
    return {"upload": upload, "offset": (_session(settings, upload) / "data").stat().st_size}


@router.patch("/v1/uploads/{upload}", dependencies=[submit_before_body(_limit)])
async def append_upload(upload: str, request: Request, settings: SettingsDep,
                        upload_offset: Annotated[int, Header(ge=0)]) -> dict[str, Any]:
    """Append the body at ``Upload-Offset`` (which must be what the session holds)."""
    limit = _limit(request)
    try:
        d = _session(settings, upload)
        with _exclusive(d):
            return await _append(request, settings, upload, d / "data", upload_offset, limit)
    except E.FarmError:
        await drain(request, limit)
        raise


async def _append(request: Request, settings: Settings, upload: str, data: Path, upload_offset: int,
                  limit: int) -> dict[str, Any]:
    have = data.stat().st_size
    if upload_offset != have:
        raise E.UsageError(f"upload {upload} holds {have} bytes, the piece starts at {upload_offset}",
                           hint=f"GET /v1/uploads/{upload} says where to go on from")
    size = have
    with open(data, "ab") as f:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    f.truncate(have)  # the piece is refused whole
                    raise E.TooLargeError(f"the upload is over {settings.max_upload_mb} MiB")
                f.write(chunk)
        except E.FarmError:
            raise
        except Exception:
            f.flush()  # a cut connection: what arrived stays; the client resumes from there
            raise
    return {"upload": upload, "offset": size}


@router.post("/v1/uploads/{upload}/complete", response_model=ModelOut, dependencies=[submit])
async def complete_upload(upload: str, request: Request, settings: SettingsDep, reg: RegistryDep,
                          name: Annotated[str | None, Query(max_length=255)] = None,
                          tag: Annotated[str | None, Query(max_length=128)] = None,
                          force_tag: bool = False,
                          bundle_type: Annotated[str, Query(max_length=64)] = "application/x-tar") -> ModelOut:
    """The session's bytes as one ``POST /v1/models`` body of type ``bundle_type``; the session
    is gone afterwards, whatever the answer."""
    from farm.api.routes.models import UNPACKERS, _accept_upload

    name_, tag_ = plan.check_name_tag(name, tag)
    d = _session(settings, upload)
    with _exclusive(d):
        try:
            # On the uploads' own threads, as POST /v1/models: never in front of resolve.
            return await asyncio.get_running_loop().run_in_executor(
                UNPACKERS, _accept_upload, settings, reg, d / "data", bundle_type, d / "bundle", _limit(request),
                name_, tag_, force_tag)
        finally:
            shutil.rmtree(d, ignore_errors=True)
