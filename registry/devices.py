"""Enrolled device agents: ``farm device enroll | list | revoke`` and the agent's side of enrollment.

An admin makes a single-use, expiring enrollment token (only its sha256 is kept); the agent
presents it once with its Ed25519 public key and what it is, and gets back a bearer token of its
own (scope ``read``: it installs artifacts as any device does) tied to the device row. The service
trusts nothing about a device beyond that row: reports are checked against its key and SoC.
Revoking a device revokes its bearer token and strikes its verifications in one transaction.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from farm.core.errors import DeviceRevokedError, EnrollmentInvalidError, NotFoundError, UsageError
from farm.core.names import check_name
from registry.models import ApiToken, Device, DeviceVerification

ENROLL_PREFIX = "cfe_"
DEFAULT_EXPIRES_S = 24 * 3600
MAX_EXPIRES_S = 30 * 24 * 3600
SIMULATOR = "simulator"
TOKEN_NAME = "device:{name}"  # the agent's bearer token; ':' is outside the token-name grammar: no clash
FACT_KEYS = ("arch", "os", "device_model", "runtime", "onnxruntime", "ep_package", "ep_version")
FACT_MAX = 128


@dataclass(frozen=True)
class Enrollment:
    name: str
    token: str
    expires: datetime


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def parse_duration(text: str) -> int:
    """``30m``, ``12h``, ``7d``, ``90s`` or plain seconds -> seconds (1 s .. 30 days)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    raw = str(text).strip().lower()
    num, unit = (raw[:-1], raw[-1]) if raw[-1:] in units else (raw, "s")
    if not num.isdigit() or not 0 < int(num) * units[unit] <= MAX_EXPIRES_S:
        raise UsageError(f"--expires {str(text)[:40]!r} is not a duration from 1s to 30d",
                         hint="e.g. --expires 30m, 12h, 7d")
    return int(num) * units[unit]


def create_enrollment(session: Session, name: str, *, expires_s: int = DEFAULT_EXPIRES_S,
                      by: str | None = None) -> Enrollment:
    """A new device row waiting for its agent, and its enrollment token (returned once)."""
    check_name(name)
    token = ENROLL_PREFIX + secrets.token_urlsafe(32)
    expires = datetime.now(UTC) + timedelta(seconds=expires_s)
    try:
        with session.begin_nested():
            session.add(Device(name=name, enroll_hash=_hash(token), enroll_expires_at=expires, created_by=by))
    except IntegrityError:
        raise UsageError(f"a device named {name!r} exists", hint="farm device list shows them; pick another name") \
            from None
    return Enrollment(name, token, expires)


def _aware(when: datetime | None) -> datetime | None:
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when  # SQLite drops the zone


def check_public_key(public_b64: Any) -> str:
    """A raw Ed25519 public key, base64: 32 bytes, nothing else."""
    try:
        raw = base64.b64decode(public_b64, validate=True) if isinstance(public_b64, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise UsageError("public_key is not a base64 raw Ed25519 public key (32 bytes)")
    return base64.b64encode(raw).decode()


def check_facts(facts: Any) -> dict[str, str]:
    """What the agent says it is: the known keys only, printable, bounded."""
    from farm.core.text import unprintable

    if not isinstance(facts, dict) or set(facts) - set(FACT_KEYS):
        raise UsageError(f"facts: an object with at most the keys {', '.join(FACT_KEYS)}")
    out = {}
    for key, value in facts.items():
        if value is None:
            continue
        if not isinstance(value, str) or len(value) > FACT_MAX:
            raise UsageError(f"facts.{key}: a string of at most {FACT_MAX} characters")
        if (bad := unprintable(value)) is not None:
            raise UsageError(f"facts.{key} holds {bad}: not printable text")
        out[key] = value
    return out


def enroll(session: Session, token: str, public_key: str, soc: str, facts: dict[str, Any]) -> tuple[Device, str]:
    """Use an enrollment token: record the key and facts, make the agent's bearer token. Returns
    (device, bearer token). The token is spent by a guarded UPDATE: two agents presenting it at
    once, one wins."""
    from registry.signing import key_id
    from registry.tokens import PREFIX

    public_key = check_public_key(public_key)
    facts = check_facts(facts)
    soc = _check_soc(soc, facts)
    now = datetime.now(UTC)
    row = session.scalar(select(Device).where(Device.enroll_hash == _hash(str(token))))
    if row is None or row.enrolled_at is not None or row.revoked_at is not None \
            or (_aware(row.enroll_expires_at) or now) <= now:
        why = "unknown" if row is None else "already used" if row.enrolled_at is not None else \
            "revoked" if row.revoked_at is not None else "expired"
        raise EnrollmentInvalidError(f"the enrollment token is {why}")
    bearer = PREFIX + secrets.token_urlsafe(32)
    api = ApiToken(name=TOKEN_NAME.format(name=row.name), scope="read", token_hash=_hash(bearer))
    session.add(api)
    session.flush()
    try:
        with session.begin_nested():
            spent = session.execute(
                update(Device).where(Device.id == row.id, Device.enrolled_at.is_(None), Device.revoked_at.is_(None))
                .values(enrolled_at=now, public_key=public_key, key_id=key_id(public_key), token_id=api.id, soc=soc,
                        simulator=soc == SIMULATOR, facts=facts).execution_options(synchronize_session=False))
    except IntegrityError:  # one key, one device: a second device with it would count twice
        raise UsageError("this public key is enrolled already", hint="each device makes its own key pair") from None
    if spent.rowcount != 1:  # type: ignore[attr-defined]
        raise EnrollmentInvalidError("the enrollment token is already used")
    session.refresh(row)
    return row, bearer


def _check_soc(soc: Any, facts: dict[str, str]) -> str:
    """``simulator`` (an x86 host: a QNN runtime there is the HTP simulator) or a catalog SoC."""
    from farm.core.catalog import load_catalog
    from farm.core.errors import NotDeviceEvidenceError
    from registry.reports import canonical_arch

    arch = canonical_arch(str(facts.get("arch") or ""))
    if arch is None:
        raise UsageError("facts.arch: the CPU architecture (uname -m or an Android ABI) is required")
    facts["arch"] = arch
    if soc == SIMULATOR:
        return SIMULATOR
    if arch in ("x86_64", "x86"):
        raise NotDeviceEvidenceError(f"an {arch} host can enroll only as {SIMULATOR!r}: a QNN runtime there is the "
                                     "HTP simulator, not a device")
    if not isinstance(soc, str):
        raise UsageError("soc: a catalog SoC (e.g. SM8650) or 'simulator'")
    return load_catalog().get(soc, backend="qnn").name


def device_of_token(session: Session, token_id: int) -> Device:
    """The device whose bearer token this is; forbidden for any other token."""
    from farm.core.errors import ForbiddenError

    row = session.scalar(select(Device).where(Device.token_id == token_id))
    if row is None:
        raise ForbiddenError("this token is not an enrolled device's", hint="enroll the agent: ctxfarm-agent enroll")
    if row.revoked_at is not None:
        raise DeviceRevokedError(f"device {row.name!r} was revoked")
    return row


def list_devices(session: Session) -> list[dict[str, Any]]:
    from farm.core.times import iso

    out = []
    for d in session.scalars(select(Device).order_by(Device.name)):
        state = "revoked" if d.revoked_at else "enrolled" if d.enrolled_at else "waiting"
        if state == "waiting" and (_aware(d.enroll_expires_at) or datetime.now(UTC)) <= datetime.now(UTC):
            state = "expired"
        out.append({"name": d.name, "state": state, "soc": d.soc, "simulator": d.simulator, "key_id": d.key_id,
                    **{k: (d.facts or {}).get(k) for k in ("arch", "os", "runtime", "ep_version")},
                    "enrolled_at": iso(d.enrolled_at), "revoked_at": iso(d.revoked_at),
                    "expires": iso(d.enroll_expires_at) if state in ("waiting", "expired") else None})
    return out


def revoke_device(session: Session, name: str) -> int:
    """Revoke a device: its enrollment token, its bearer token, and its verifications struck
    (``device revoked``); returns how many were struck."""
    from registry.models import VerificationJob

    now = datetime.now(UTC)
    row = session.scalar(select(Device).where(Device.name == name, Device.revoked_at.is_(None)))
    if row is None:
        raise NotFoundError(f"no device named {name!r} that is not revoked", hint="farm device list shows them")
    row.revoked_at = now
    if row.token_id is not None:
        from registry.tokens import _bump_revocations

        session.execute(update(ApiToken).where(ApiToken.id == row.token_id, ApiToken.revoked_at.is_(None))
                        .values(revoked_at=now).execution_options(synchronize_session=False))
        # As any token revocation: every service process stops trusting its cached copy at once.
        _bump_revocations(session)
    struck = session.execute(update(DeviceVerification)
                             .where(DeviceVerification.device_id == row.id, DeviceVerification.struck_at.is_(None))
                             .values(struck_at=now, struck_why="device revoked")
                             .execution_options(synchronize_session=False))
    # Its leases go back to the queue at once.
    session.execute(update(VerificationJob).where(VerificationJob.device_id == row.id,
                                                  VerificationJob.state == "leased")
                    .values(state="queued", device_id=None, nonce=None, lease_until=None)
                    .execution_options(synchronize_session=False))
    session.flush()
    return int(struck.rowcount or 0)  # type: ignore[attr-defined]


def token_name(session: Session, token_id: int) -> str:
    """Who did it, for the record: the token's name."""
    return str(session.scalar(select(ApiToken.name).where(ApiToken.id == token_id)) or f"token {token_id}")
