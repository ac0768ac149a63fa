"""A token's bytes quota (FARM_QUOTA_UPLOAD_MB): what its open upload sessions hold and what the
blobs it stored with ``PUT /v1/blobs`` that no model references yet hold (``blob_puts``), the
latter for FARM_UPLOAD_TTL_S at most. Used by the upload-session and blob routes; a blob is freed
when any model that holds it is recorded (``registry.index.record_model``: an upload, a model or
a genai package recorded from blobs, its parts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from farm.core.settings import Settings
from registry.index import Registry


def _since(settings: Settings) -> datetime:
    """Blobs stored before this no longer count (FARM_UPLOAD_TTL_S, as an untouched session)."""
    return datetime.now(UTC) - timedelta(seconds=settings.upload_ttl_s)


def held_bytes(settings: Settings, reg: Registry, owner: int, *, except_upload: str = "") -> int:
    """What FARM_QUOTA_UPLOAD_MB counts for a token: the bytes its open sessions hold (less
    ``except_upload``) and those of the blobs it stored with ``PUT /v1/blobs`` that no model
    references yet, for FARM_UPLOAD_TTL_S after each was stored."""
    from sqlalchemy import func, select

    from registry.models import BlobPut, UploadSession

    with reg.db.session() as s:
        sessions = s.scalar(select(func.coalesce(func.sum(UploadSession.size), 0))
                            .where(UploadSession.owner_token_id == owner, UploadSession.id != except_upload))
        blobs = s.scalar(select(func.coalesce(func.sum(BlobPut.size), 0))
                         .where(BlobPut.token_id == owner, BlobPut.created_at >= _since(settings)))
        return int(sessions or 0) + int(blobs or 0)


def count_blob(settings: Settings, reg: Registry, token_id: int, digest: str, size: int) -> None:
    """The blob counts for this token now; its rows past FARM_UPLOAD_TTL_S go."""
    from sqlalchemy import delete

    from registry.models import BlobPut

    with reg.db.session() as s:
        s.execute(delete(BlobPut).where(BlobPut.token_id == token_id, BlobPut.created_at < _since(settings)))
        s.add(BlobPut(token_id=token_id, digest=digest, size=size))

