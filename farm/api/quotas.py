"""A token's bytes quota (FARM_QUOTA_UPLOAD_MB): what its open upload sessions hold and what the
blobs it stored with ``PUT /v1/blobs`` that no model references yet hold (``blob_puts``), the
latter for FARM_UPLOAD_TTL_S at most. Used by the upload-session and blob routes; a blob is freed
when any model that holds it is recorded (``registry.index.record_model``: an upload, a model or
a genai package recorded from blobs, its parts).

The room a body may fill is taken before a byte of it is read, counted and taken in one step
under the token's lock (``Database.serialized("uploads", token)``, as the count of sessions and
releases: every process and host of the service shares it on PostgreSQL): a blob's as its
``blob_puts`` row, a session's piece by raising the session's ``size``. Its declared size
(Content-Length) is what is taken; a body without one takes what is free, up to the upload cap.
When the body ends, what it did not bring is given back (all of it when it failed), so requests
that come at once never hold more than the quota together."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from farm.core import errors as E
from farm.core.settings import Settings
from registry.index import Registry


def _since(settings: Settings) -> datetime:
    """Blobs stored before this no longer count (FARM_UPLOAD_TTL_S, as an untouched session)."""
    return datetime.now(UTC) - timedelta(seconds=settings.upload_ttl_s)


def over_quota(settings: Settings) -> E.QuotaUploadBytesError:
    return E.QuotaUploadBytesError(f"this token's upload sessions and unreferenced blobs would hold over "
                                   f"{settings.quota_upload_mb} MiB (FARM_QUOTA_UPLOAD_MB)")


def _held(s: Any, settings: Settings, owner: int, except_upload: str = "") -> int:
    """What FARM_QUOTA_UPLOAD_MB counts for a token: the bytes its open sessions hold (less
    ``except_upload``) and those of the blobs it stored with ``PUT /v1/blobs`` that no model
    references yet, for FARM_UPLOAD_TTL_S after each was stored; room taken by bodies still
    arriving included."""
    from sqlalchemy import func, select

    from registry.models import BlobPut, UploadSession

    sessions = s.scalar(select(func.coalesce(func.sum(UploadSession.size), 0))
                        .where(UploadSession.owner_token_id == owner, UploadSession.id != except_upload))
    blobs = s.scalar(select(func.coalesce(func.sum(BlobPut.size), 0))
                     .where(BlobPut.token_id == owner, BlobPut.created_at >= _since(settings)))
    return int(sessions or 0) + int(blobs or 0)


def _wanted(settings: Settings, free: int, declared: int | None, most: int) -> int:
    """The bytes to take: ``declared``, or without it what is free up to ``most``; 429 when that
    is more than is free, or nothing is free for a body of unknown size."""
    want = declared if declared is not None else min(most, free)
    if want > free or (declared is None and free <= 0):
        raise over_quota(settings)
    return want


def take_for_blob(settings: Settings, reg: Registry, token_id: int, digest: str, declared: int | None,
                  limit: int) -> tuple[int, int]:
    """Room for one blob of ``token_id``, taken now: (its ``blob_puts`` row, the bytes taken).
    The row counts until ``settle_blob`` or ``give_back_blob``; the token's rows past
    FARM_UPLOAD_TTL_S go."""
    from sqlalchemy import delete

    from registry.models import BlobPut

    with reg.db.serialized("uploads", token_id), reg.db.session() as s:
        s.execute(delete(BlobPut).where(BlobPut.token_id == token_id, BlobPut.created_at < _since(settings)))
        free = settings.quota_upload_mb * 1024 * 1024 - _held(s, settings, token_id)
        want = _wanted(settings, free, declared, limit)
        row = BlobPut(token_id=token_id, digest=digest, size=want)
        s.add(row)
        s.flush()
        return int(row.id), want


def settle_blob(reg: Registry, row_id: int, size: int) -> None:
    """The blob is stored: its row counts ``size`` bytes from now (FARM_UPLOAD_TTL_S). A second
    row of the same token and digest (the same blob sent twice at once) goes: it is held once."""
    from sqlalchemy import delete, select, update

    from registry.models import BlobPut

    with reg.db.session() as s:
        row = s.get(BlobPut, row_id)
        if row is None:  # a model that holds the blob was recorded meanwhile: it counts no more
            return
        twin = s.scalar(select(BlobPut.id).where(BlobPut.token_id == row.token_id, BlobPut.digest == row.digest,
                                                 BlobPut.id != row_id).limit(1))
        if twin is not None:
            s.execute(delete(BlobPut).where(BlobPut.id == row_id))
        else:
            s.execute(update(BlobPut).where(BlobPut.id == row_id).values(size=size, created_at=datetime.now(UTC)))


def give_back_blob(reg: Registry, row_id: int) -> None:
    """The blob was not stored (its body failed): its room is free again."""
    from sqlalchemy import delete

    from registry.models import BlobPut

    with reg.db.session() as s:
        s.execute(delete(BlobPut).where(BlobPut.id == row_id))


def take_for_piece(settings: Settings, reg: Registry, owner: int, upload: str, have: int, declared: int | None,
                   limit: int) -> int:
    """Room for a piece of session ``upload`` (of token ``owner``, holding ``have`` bytes), taken
    now by raising the session's size: the bytes the piece may bring. The caller sets the size
    to what the session holds once the piece ends, however it ends."""
    from sqlalchemy import update

    from registry.models import UploadSession

    with reg.db.serialized("uploads", owner), reg.db.session() as s:
        free = settings.quota_upload_mb * 1024 * 1024 - _held(s, settings, owner, except_upload=upload) - have
        want = _wanted(settings, free, declared, limit - have)
        s.execute(update(UploadSession).where(UploadSession.id == upload).values(size=have + want))
        return want
