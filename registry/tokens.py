"""Bearer tokens of the HTTP service: scopes ``read`` (devices) < ``submit`` (pipelines) <
``admin`` (ops). Only a token's sha256 is stored; the token is shown once, at creation."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from farm.core.errors import NotFoundError, UsageError
from farm.core.names import check_name
from registry.models import TOKEN_SCOPES, ApiToken, TokenRevocations

# read < submit < admin; ``report`` (devices posting load reports) stands apart: it can report and
# nothing else, and only it and admin can report.
RANK = {"read": 0, "submit": 1, "admin": 2}
PREFIX = "cfk_"


@dataclass(frozen=True)
class TokenInfo:
    name: str
    scope: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def create_token(session: Session, name: str, scope: str) -> str:
    """A new token (returned once; only its hash is kept)."""
    check_name(name)
    if scope not in TOKEN_SCOPES:
        raise UsageError(f"unknown scope {scope!r}", hint=f"scopes: {', '.join(TOKEN_SCOPES)}")
    token = PREFIX + secrets.token_urlsafe(32)
    try:
        with session.begin_nested():
            session.add(ApiToken(name=name, scope=scope, token_hash=_hash(token)))
    except IntegrityError:
        raise UsageError(f"a token named {name!r} exists", hint="revoke it first, or pick another name") from None
    return token


def list_tokens(session: Session) -> list[TokenInfo]:
    return [TokenInfo(t.name, t.scope, t.created_at, t.revoked_at, t.last_used_at)
            for t in session.scalars(select(ApiToken).order_by(ApiToken.name))]


def revoke_token(session: Session, name: str) -> None:
    """Revoke a token, and withdraw what it said: its device reports (and, an enrolled device's
    token, its device lab reports) are struck (``token revoked``) in the same transaction, so no
    artifact stays quarantined, preferred or confirmed on its word. The revocation version is
    bumped in the same transaction: every service process refuses the token from the moment it
    commits (``farm.api.auth``)."""
    from registry.models import DeviceReport

    now = datetime.now(UTC)
    token_id = session.scalar(select(ApiToken.id).where(ApiToken.name == name, ApiToken.revoked_at.is_(None)))
    n = session.execute(update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
                        .values(revoked_at=now).execution_options(synchronize_session=False))
    if token_id is None or not n.rowcount:  # type: ignore[attr-defined]
        raise NotFoundError(f"no active token named {name!r}", hint="`farm token list` shows them")
    session.execute(update(DeviceReport).where(DeviceReport.token_id == token_id, DeviceReport.revoked_at.is_(None))
                    .values(revoked_at=now, revoked_why="token revoked").execution_options(synchronize_session=False))
    # An enrolled device's bearer token: its device lab reports are withdrawn with it.
    from registry.models import Device, DeviceVerification

    session.execute(update(DeviceVerification)
                    .where(DeviceVerification.device_id.in_(select(Device.id).where(Device.token_id == token_id)),
                           DeviceVerification.struck_at.is_(None))
                    .values(struck_at=now, struck_why="token revoked").execution_options(synchronize_session=False))
    _bump_revocations(session)


# The statement a service process reads before it trusts a token it cached (farm.api.auth).
VERSION_SQL = "SELECT version FROM token_revocations WHERE id = 1"


def revocation_version(session: Session) -> int:
    """The revocation version: bumped by every ``revoke_token``, in its transaction."""
    return int(session.scalar(select(TokenRevocations.version).where(TokenRevocations.id == 1)) or 0)


def _bump_revocations(session: Session) -> None:
    n = session.execute(update(TokenRevocations).where(TokenRevocations.id == 1)
                        .values(version=TokenRevocations.version + 1).execution_options(synchronize_session=False))
    if not n.rowcount:  # type: ignore[attr-defined]  # a database whose row was never made
        session.add(TokenRevocations(id=1, version=1))


def scope_of(session: Session, token: str) -> str | None:
    """The scope of a valid, unrevoked token; None otherwise."""
    if not token.startswith(PREFIX) or len(token) > 128:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == _hash(token), ApiToken.revoked_at.is_(None)))
    return row.scope if row is not None else None


def allows(scope: str | None, needed: str) -> bool:
    if scope is None:
        return False
    if needed == "report":
        return scope in ("report", "admin")
    if scope == "report":
        return False
    return RANK[scope] >= RANK[needed]


def token_identity(session: Session, token: str) -> tuple[int, str, str] | None:
    """(id, name, scope) of a valid, unrevoked token; None otherwise (device reports are
    attributed to the token that sent them)."""
    if not token.startswith(PREFIX) or len(token) > 128:
        return None
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == _hash(token), ApiToken.revoked_at.is_(None)))
    return (row.id, row.name, row.scope) if row is not None else None
