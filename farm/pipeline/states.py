"""The build state machine: every state, and every transition as one guarded UPDATE.

::

    (new) ──enqueue──▶ queued ──claim──▶ running ──succeed──▶ succeeded
                         ▲  ▲               │ │                  │
                         │  └──requeue──────┘ │ (infra failure,  │ (artifact broken:
                         │  └──release────────┘  attempts left;  │  enqueue reopens)
                         │    (SIGTERM/SIGINT:   interrupted)    │
                         └───────── enqueue (infra failure, --retry-failed) ◀── failed ◀──fail── running
    running, lease expired ──claim──▶ running (attempt + 1)   or ──▶ failed/worker-lost at the cap
    queued | running ──cancel──▶ failed/cancelled (``farm cancel``: the running attempt's next lease
                                 renewal finds the row changed, and its compile child is killed)
    queued | running (this process's lease) ──abandon──▶ failed/<code> (an exception escaped the
                                 thread that ran it: no one else would ever finish it)

A claim hands out a ``Lease`` (build id, a unique owner token, the attempt number). Every later
transition of that attempt is an UPDATE whose WHERE repeats all three plus the expected state,
and its row count is checked: an executor whose lease lapsed and was taken over changes nothing
(``LeaseLostError``). Interruptions give the attempt back, so Ctrl-C never eats the budget that
caps dead workers (``max_attempts``, then ``worker-lost``).

The same machine runs a genai part's twin builds (``registry.models.TwinBuild``: the columns of
``builds`` in a table of their own, which nothing that serves devices reads): a transition
takes the table (``table=``), and a lease remembers the table of its row.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from farm.core.errors import DETERMINISTIC_FAILURES, LeaseLostError, NotFoundError
from registry.models import Artifact, Build


class BuildState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


FINAL = frozenset({BuildState.SUCCEEDED, BuildState.FAILED})


def now() -> datetime:
    return datetime.now(UTC)


def aware(dt: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we store is UTC.
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


def owner_base() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class BuildSpec:
    build_key: str
    model_digest: str
    backend: str
    target: str
    toolchain: str
    options: dict[str, Any]
    options_digest: str


@dataclass(frozen=True)
class Lease:
    """One attempt's right to change a build row: all three are in every guarded WHERE."""

    build_id: int
    owner: str
    attempt: int
    table: Any = Build  # the row's table: ``builds``, or ``twin_builds``


@dataclass(frozen=True)
class Claim:
    """``run`` (ours: ``lease`` set), ``done`` (final: answer from the index), ``busy`` (another
    executor holds a live lease) or ``exhausted`` (attempt cap reached: now failed/worker-lost)."""

    action: str
    build_id: int
    lease: Lease | None = None


def _changed(session: Session, stmt: Any) -> int:
    result: CursorResult[Any] = session.execute(stmt.execution_options(synchronize_session=False))  # type: ignore[assignment]
    return int(result.rowcount)


def _guard(lease: Lease) -> tuple[Any, ...]:
    T = lease.table
    return (T.id == lease.build_id, T.state == BuildState.RUNNING.value, T.lease_owner == lease.owner,
            T.attempts == lease.attempt)


def get_build(session: Session, build_id: int, table: Any = Build) -> Any:
    row = session.get(table, build_id)
    if row is None:
        raise NotFoundError(f"no build {build_id}", hint="`farm status RELEASE` lists a release's builds")
    return row


def lease_expired(build: Build, at: datetime | None = None) -> bool:
    lease = aware(build.lease_expires_at)
    return build.state == BuildState.RUNNING and lease is not None and lease <= (at or now())


# ---- transitions --------------------------------------------------------------------------------

def enqueue(session: Session, spec: BuildSpec, queue: str | None, *, retry_failed: bool = False,
            table: Any = Build) -> tuple[int, bool]:
    """Insert the build row as ``queued`` (the UNIQUE build key dedupes) or reopen it.

    Reopened: a failure for an infrastructure reason (a new submission is a new chance, with a
    fresh attempt budget), any failure with ``retry_failed``, and a success whose artifact was
    marked broken. Returns (build id, whether work was queued by this call).
    """
    T = table
    row = session.scalar(select(T).where(T.build_key == spec.build_key))
    if row is None:
        row = T(build_key=spec.build_key, model_digest=spec.model_digest, backend=spec.backend,
                    target=spec.target, toolchain=spec.toolchain, options=spec.options,
                    options_digest=spec.options_digest, state=BuildState.QUEUED.value, attempts=0, queue=queue,
                    enqueued_at=now())
        try:
            with session.begin_nested():
                session.add(row)
            return row.id, True
        except IntegrityError:
            # Lost the race on the UNIQUE key: the winner queued it (and sends its message).
            row = session.scalar(select(T).where(T.build_key == spec.build_key))
            if row is None:
                raise
            return row.id, False
    reopen = False
    if row.state == BuildState.FAILED:
        reopen = retry_failed or row.error_code not in DETERMINISTIC_FAILURES
    elif row.state == BuildState.SUCCEEDED and T is Build:
        status = session.scalar(select(Artifact.status).where(Artifact.build_id == row.id))
        reopen = status == "broken"
    if not reopen:
        return row.id, False
    n = _changed(session, update(T).where(T.id == row.id, T.state == row.state, T.attempts == row.attempts)
                 .values(state=BuildState.QUEUED.value, attempts=0, error_code=None, error_message=None,
                         queue=queue, enqueued_at=now(), finished_at=None, lease_owner=None, lease_expires_at=None))
    return row.id, n == 1


def claim(session: Session, build_id: int, *, owner: str, lease_seconds: float, max_attempts: int,
          table: Any = Build) -> Claim:
    """Take a queued build, or one whose holder's lease ran out (it died), for one attempt."""
    T = table
    # One SELECT that also overwrites a stale copy in the session (what get + refresh did in two).
    row = session.get(T, build_id, populate_existing=True)
    if row is None:
        raise NotFoundError(f"no build {build_id}", hint="`farm status RELEASE` lists a release's builds")
    if row.state in FINAL:
        return Claim("done", row.id)
    t = now()
    if row.state == BuildState.RUNNING and not lease_expired(row, t):
        return Claim("busy", row.id)
    expected = (T.id == row.id, T.state == row.state, T.attempts == row.attempts,
                T.lease_owner.is_(None) if row.lease_owner is None else T.lease_owner == row.lease_owner)
    if row.attempts >= max_attempts:
        # Every attempt so far died with its executor (a poison model, or a flaky host).
        n = _changed(session, update(T).where(*expected).values(
            state=BuildState.FAILED.value, error_code="worker-lost",
            error_message=f"gave up after {row.attempts} attempt(s): the executor was lost each time"
                          + (f" (last: {row.error_message})" if row.error_message else ""),
            lease_owner=None, lease_expires_at=None, finished_at=t))
        return Claim("exhausted" if n else "busy", row.id)
    token = f"{owner}#{uuid.uuid4().hex[:8]}"
    attempt = row.attempts + 1
    n = _changed(session, update(T).where(*expected).values(
        state=BuildState.RUNNING.value, attempts=attempt, lease_owner=token,
        lease_expires_at=t + timedelta(seconds=lease_seconds), started_at=t, finished_at=None, worker=owner))
    if n != 1:
        return Claim("busy", row.id)
    return Claim("run", row.id, Lease(row.id, token, attempt, T))


def part_builds(session: Session, package_build_id: int) -> list[int] | None:
    """The part builds of a genai package's build in part order; None: not a package build."""
    from registry.models import GenaiPart

    rows = session.execute(select(GenaiPart.part, GenaiPart.part_build_id)
                           .where(GenaiPart.package_build_id == package_build_id).order_by(GenaiPart.part)).all()
    return [int(r[1]) for r in rows] if rows else None


def next_queued(session: Session, queue: str, *, lock: bool = True) -> int | None:
    """The build a worker of ``queue`` takes next without waiting for the broker: the
    oldest queued build of the queue whose backoff is over, not a genai package (those are sent
    when their parts are final, ``farm.pipeline.genai``). PostgreSQL locks the row until the
    caller's transaction ends and skips rows another worker has locked, so two workers asking
    at once get two builds; ``claim`` in the same transaction is the arbiter everywhere.
    ``lock=False``: a look only (what to prefetch), nothing locked."""
    from registry.models import GenaiPart

    stmt = (select(Build.id)
            .where(Build.state == BuildState.QUEUED.value, Build.queue == queue, Build.enqueued_at <= now(),
                   ~select(GenaiPart.package_build_id).where(GenaiPart.package_build_id == Build.id).exists())
            .order_by(Build.enqueued_at, Build.id).limit(1))
    if lock and session.get_bind().dialect.name == "postgresql":
        stmt = stmt.with_for_update(of=Build, skip_locked=True)
    return session.scalar(stmt)


def renew(session: Session, lease: Lease, lease_seconds: float) -> bool:
    """Extend our lease; False means it is no longer ours (stop working, publish nothing)."""
    return _changed(session, update(lease.table).where(*_guard(lease))
                    .values(lease_expires_at=now() + timedelta(seconds=lease_seconds))) == 1


def succeed(session: Session, lease: Lease, *, log: str | None, phases: dict[str, Any] | None = None) -> None:
    """running -> succeeded, in the publishing transaction (raises LeaseLostError, which rolls
    the artifact insert back with it). ``phases``: where the attempt's time went."""
    n = _changed(session, update(lease.table).where(*_guard(lease)).values(
        state=BuildState.SUCCEEDED.value, log=log, error_code=None, error_message=None, finished_at=now(),
        lease_owner=None, lease_expires_at=None, phases=phases))
    if n != 1:
        raise LeaseLostError(f"build {lease.build_id}: attempt {lease.attempt} lost its lease before publishing")


def fail(session: Session, lease: Lease, code: str, message: str, log: str | None,
         phases: dict[str, Any] | None = None) -> bool:
    """running -> failed (deterministic failure, or the attempt cap reached)."""
    return _changed(session, update(lease.table).where(*_guard(lease)).values(
        state=BuildState.FAILED.value, error_code=code, error_message=message, log=log, finished_at=now(),
        lease_owner=None, lease_expires_at=None, phases=phases)) == 1


def requeue(session: Session, lease: Lease, code: str, message: str, log: str | None, *, delay: float,
            phases: dict[str, Any] | None = None) -> bool:
    """running -> queued after an infrastructure failure with attempts left; the error is kept
    for status, and ``enqueued_at`` (not before) holds the reconciler off during the backoff."""
    return _changed(session, update(lease.table).where(*_guard(lease)).values(
        state=BuildState.QUEUED.value, error_code=code, error_message=message, log=log, lease_owner=None,
        lease_expires_at=None, enqueued_at=now() + timedelta(seconds=delay), phases=phases)) == 1


def release(session: Session, lease: Lease, reason: str) -> bool:
    """running -> queued at once (SIGTERM/SIGINT): the next executor takes over without waiting
    for the lease to lapse, and the attempt is given back (an interruption is not a death)."""
    return _changed(session, update(lease.table).where(*_guard(lease)).values(
        state=BuildState.QUEUED.value, attempts=lease.attempt - 1, error_code="interrupted",
        error_message=f"attempt {lease.attempt} interrupted ({reason}) at {now().isoformat(timespec='seconds')}",
        lease_owner=None, lease_expires_at=None, enqueued_at=now())) == 1


def cancel(session: Session, build_id: int, reason: str, *, table: Any = Build) -> str:
    """queued | running -> failed with code ``cancelled``: one guarded UPDATE on the state,
    attempt and lease owner that were read (a race with a claim or a finish is read again).
    The running attempt loses its lease: its keeper's next renewal changes no row, and the
    executor kills the compile and publishes nothing. A queued build's message, when a worker
    takes it, finds the row final and is dropped. Returns ``cancelled``, or the final state the
    build already had. ``table``: a genai part's twin build (``registry.models.TwinBuild``) is
    cancelled the same way."""
    T = table
    for _ in range(5):
        row = session.get(T, build_id, populate_existing=True)
        if row is None:
            raise NotFoundError(f"no build {build_id}", hint="`farm status RELEASE` lists a release's builds")
        if row.state in FINAL:
            return str(row.state)
        was = f"{row.state}, attempt {row.attempts}" if row.state == BuildState.RUNNING else str(row.state)
        n = _changed(session, update(T).where(
            T.id == row.id, T.state == row.state, T.attempts == row.attempts,
            T.lease_owner.is_(None) if row.lease_owner is None else T.lease_owner == row.lease_owner)
            .values(state=BuildState.FAILED.value, error_code="cancelled",
                    error_message=f"cancelled ({reason}) while {was} at {now().isoformat(timespec='seconds')}",
                    lease_owner=None, lease_expires_at=None, finished_at=now()))
        if n == 1:
            return "cancelled"
    return "busy"


def abandon(session: Session, build_id: int, owner: str, code: str, message: str) -> bool:
    """queued, or running under a lease of ``owner`` (``owner_base()``: this process), -> failed
    with ``code``: the build whose thread raised past every handler (the embedded runner's pool
    future) ends with a code, so its release finishes and frees its token's quota. One guarded
    UPDATE on what was read; a build another process holds, or one already final, is left as it
    is (False)."""
    row = session.get(Build, build_id, populate_existing=True)
    if row is None or row.state in FINAL:
        return False
    if row.state == BuildState.RUNNING and not str(row.lease_owner or "").startswith(f"{owner}#"):
        return False
    return _changed(session, update(Build).where(
        Build.id == row.id, Build.state == row.state, Build.attempts == row.attempts,
        Build.lease_owner.is_(None) if row.lease_owner is None else Build.lease_owner == row.lease_owner)
        .values(state=BuildState.FAILED.value, error_code=code, error_message=message[:4000], lease_owner=None,
                lease_expires_at=None, finished_at=now())) == 1


# ---- what the reconciler re-sends -----------------------------------------------------------------

def take_orphans(session: Session, queues: list[str], *, resend_after: float, pending: set[int],
                 limit: int = 200, table: Any = Build) -> list[tuple[int, str]]:
    """(build id, queue) of builds on these queues that have no live message, taken for a
    re-send: running under an expired lease (its executor died mid-build), or queued for
    ``resend_after`` seconds with no message waiting in the broker (``pending``: the worker that
    took it died before claiming, or the broker lost it). A compare-and-set on ``enqueued_at``
    makes one reconciler of many send each, at most once per ``resend_after``."""
    T = table
    t = now()
    cutoff = t - timedelta(seconds=resend_after)
    stale = T.enqueued_at.is_(None) | (T.enqueued_at <= cutoff)
    dead = ((T.state == BuildState.RUNNING.value) & (T.lease_expires_at <= t)
            & (stale | (T.enqueued_at <= T.lease_expires_at)))
    waiting = (T.state == BuildState.QUEUED.value) & stale
    rows = session.execute(select(T.id, T.queue, T.state).where(T.queue.in_(queues), dead | waiting)
                           .order_by(T.id).limit(limit)).all()
    taken: list[tuple[int, str]] = []
    for build_id, queue, state in rows:
        if state == BuildState.QUEUED and build_id in pending:
            continue  # its message waits behind a backlog: sending another only multiplies work
        if _changed(session, update(T).where(T.id == build_id, dead | waiting).values(enqueued_at=now())):
            taken.append((build_id, str(queue)))
    return taken
