"""Record and look up models, tags, builds and artifacts in the SQL index.

The UNIQUE build key is the arbiter of dedupe: whoever inserts the row compiles; everyone else
reads it. A build row carries a lease so a crashed compiler's build can be taken over.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import CursorResult, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from farm.config import Settings
from farm.errors import DETERMINISTIC_FAILURES, NotFoundError
from farm.keys import is_digest
from registry.db import Database
from registry.models import Artifact, ArtifactFile, Build, Model, Tag, TagEvent
from registry.store import BlobStore, open_store


@dataclass
class Registry:
    """The index database and the blob store, opened together from Settings."""

    db: Database
    store: BlobStore

    @classmethod
    def open(cls, settings: Settings) -> Registry:
        return cls(Database(settings.database_url), open_store(settings.store_url))

    def close(self) -> None:
        self.db.dispose()


def _changed(session: Session, stmt: Any) -> int:
    """Rows an UPDATE touched (the compare-and-set result)."""
    result: CursorResult[Any] = session.execute(stmt.execution_options(synchronize_session=False))  # type: ignore[assignment]
    return int(result.rowcount)


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def now() -> datetime:
    return datetime.now(UTC)


def _aware(dt: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we store is UTC.
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


# ---- models and tags ---------------------------------------------------------------------------

def record_model(session: Session, *, digest: str, onnx_digest: str, size: int, files: list[dict[str, Any]],
                 name: str) -> Model:
    model = session.get(Model, digest)
    if model is None:
        model = Model(digest=digest, onnx_digest=onnx_digest, size=size, files=files, first_name=name)
        try:
            with session.begin_nested():
                session.add(model)
        except IntegrityError:
            model = session.get(Model, digest)  # a concurrent submitter recorded it first
            assert model is not None
    return model


def find_model_by_onnx(session: Session, onnx_digest: str) -> list[Model]:
    return list(session.scalars(select(Model).where(Model.onnx_digest == onnx_digest)))


def set_tag(session: Session, name: str, tag: str, digest: str) -> bool:
    """Point NAME:TAG at a digest; returns True when the tag moved (history recorded)."""
    row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == tag))
    if row is not None and row.model_digest == digest:
        return False
    previous = row.model_digest if row else None
    if row is None:
        session.add(Tag(name=name, tag=tag, model_digest=digest))
    else:
        row.model_digest = digest
        row.updated_at = now()
    session.add(TagEvent(name=name, tag=tag, model_digest=digest, previous_digest=previous))
    return True


def resolve_model_ref(session: Session, ref: str) -> str:
    """NAME:TAG, NAME (= NAME:latest), a full digest or a unique hex prefix -> model digest."""
    if is_digest(ref):
        if session.get(Model, ref) is None:
            raise NotFoundError(f"no model {ref} in the registry")
        return ref
    name, _, tag = ref.partition(":")
    if name != "sha256":
        row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == (tag or "latest")))
        if row is not None:
            return row.model_digest
    prefix = ref.removeprefix("sha256:")
    if len(prefix) >= 6 and all(c in "0123456789abcdef" for c in prefix):
        hits = list(session.scalars(select(Model.digest).where(Model.digest.like(f"sha256:{prefix}%")).limit(2)))
        if len(hits) == 1:
            return hits[0]
    tags = [f"{n}:{t}" for n, t in session.execute(select(Tag.name, Tag.tag).order_by(Tag.name, Tag.tag).limit(20))]
    raise NotFoundError(
        f"no model {ref!r} in the registry",
        hint=("known tags: " + ", ".join(tags)) if tags else "build one first: farm build MODEL.onnx --name NAME",
    )


def tags_of(session: Session, digest: str) -> list[str]:
    return [f"{n}:{t}" for n, t in session.execute(
        select(Tag.name, Tag.tag).where(Tag.model_digest == digest).order_by(Tag.name, Tag.tag))]


# ---- builds --------------------------------------------------------------------------------------

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
class Claim:
    """What claim_build decided: ``compile`` (ours now), ``done`` (answer from the index),
    ``busy`` (someone else holds a live lease)."""

    action: str
    build_id: int
    state: str
    attempt: int


def claim_build(session: Session, spec: BuildSpec, *, lease_seconds: float, owner: str | None = None,
                max_attempts: int = 3, retry_failed: bool = False) -> Claim:
    """Insert the build row (we compile) or read the existing one.

    ``retry_failed`` re-runs a failed build whatever its code or attempt count (an operator
    who fixed the cause, e.g. raised the timeout, asks for it explicitly).
    """
    owner = owner or owner_id()
    lease_until = now() + timedelta(seconds=lease_seconds)
    row = session.scalar(select(Build).where(Build.build_key == spec.build_key))
    if row is None:
        row = Build(build_key=spec.build_key, model_digest=spec.model_digest, backend=spec.backend,
                    target=spec.target, toolchain=spec.toolchain, options=spec.options,
                    options_digest=spec.options_digest, state="running", attempts=1,
                    lease_owner=owner, lease_expires_at=lease_until, started_at=now())
        try:
            with session.begin_nested():
                session.add(row)
            return Claim("compile", row.id, "running", 1)
        except IntegrityError:
            # Lost the race on the UNIQUE key: read the winner's row.
            row = session.scalar(select(Build).where(Build.build_key == spec.build_key))
            assert row is not None
    retry = retry_failed and row.state == "failed"
    if row.state == "succeeded" or (row.state == "failed" and row.error_code in DETERMINISTIC_FAILURES and not retry):
        return Claim("done", row.id, row.state, row.attempts)
    if row.state == "failed" and row.attempts >= max_attempts and not retry:
        # Infrastructure failures are retried, but not forever (a poison model would loop).
        return Claim("done", row.id, row.state, row.attempts)
    lease = _aware(row.lease_expires_at)
    if row.state in ("queued", "running") and lease is not None and lease > now():
        return Claim("busy", row.id, row.state, row.attempts)
    # Failed for an infrastructure reason, or a lease that ran out (its holder died): take it
    # over with a compare-and-set on attempts so two takers cannot both win.
    attempt = row.attempts + 1
    taken = _changed(session,
        update(Build)
        .where(Build.id == row.id, Build.attempts == row.attempts)
        .values(state="running", attempts=attempt, lease_owner=owner, lease_expires_at=lease_until,
                started_at=now(), finished_at=None, error_code=None, error_message=None))
    if taken != 1:
        return Claim("busy", row.id, row.state, row.attempts)
    session.expire(row)
    return Claim("compile", row.id, "running", attempt)


def fail_build(session: Session, build_id: int, code: str, message: str, log: str | None) -> None:
    session.execute(
        update(Build).where(Build.id == build_id)
        .values(state="failed", error_code=code, error_message=message, log=log, lease_owner=None,
                lease_expires_at=None, finished_at=now())
        .execution_options(synchronize_session=False)
    )


def get_build(session: Session, build_id: int) -> Build:
    row = session.get(Build, build_id)
    if row is None:
        raise NotFoundError(f"no build {build_id}")
    return row


# ---- artifacts ----------------------------------------------------------------------------------

def publish_artifact(session: Session, build_id: int, *, manifest_digest: str, manifest_size: int,
                     ctx_model: str, files: list[dict[str, Any]], ep_sdk_version: str | None,
                     compile_seconds: float, nodes_ep: int, nodes_cpu: int, log: str) -> Artifact:
    """Insert the artifact and mark the build succeeded, in the caller's transaction.

    Call only after every blob (files, log, manifest) is in the store.
    """
    build = get_build(session, build_id)
    artifact = Artifact(
        digest=manifest_digest, build_id=build.id, model_digest=build.model_digest, backend=build.backend,
        target=build.target, toolchain=build.toolchain, options_digest=build.options_digest,
        ctx_model=ctx_model, ep_sdk_version=ep_sdk_version, compile_seconds=compile_seconds,
        size=sum(int(f["size"]) for f in files if f["role"] in ("ctx-model", "context")),
        nodes_ep=nodes_ep, nodes_cpu=nodes_cpu,
    )
    artifact.files = [ArtifactFile(name=f["name"], role=f["role"], digest=f["digest"], size=f["size"],
                                   media_type=f["mediaType"]) for f in files]
    artifact.files.append(ArtifactFile(name="manifest.json", role="manifest", digest=manifest_digest,
                                       size=manifest_size, media_type="application/vnd.ctxfarm.manifest.v1+json"))
    session.add(artifact)
    build.state = "succeeded"
    build.log = log
    build.finished_at = now()
    build.lease_owner = None
    build.lease_expires_at = None
    session.flush()
    return artifact


def artifact_for_build(session: Session, build_id: int) -> Artifact | None:
    return session.scalar(select(Artifact).options(selectinload(Artifact.files)).where(Artifact.build_id == build_id))


def find_artifact(session: Session, ref: str) -> Artifact:
    """An artifact by manifest digest, or by a unique prefix of its hex (>= 6 chars)."""
    hexpart = ref.removeprefix("sha256:").lower()
    if len(hexpart) < 6 or any(c not in "0123456789abcdef" for c in hexpart):
        raise NotFoundError(f"{ref!r} is not an artifact id", hint="use the id `farm ls` prints (6+ hex digits)")
    hits = list(session.scalars(
        select(Artifact).options(selectinload(Artifact.files), selectinload(Artifact.build))
        .where(Artifact.digest.like(f"sha256:{hexpart}%")).limit(2)))
    if not hits:
        raise NotFoundError(f"no artifact {ref!r}", hint="`farm ls` lists the artifacts")
    if len(hits) > 1:
        raise NotFoundError(f"artifact id {ref!r} is ambiguous", hint="give more digits")
    return hits[0]


def list_artifacts(session: Session, *, model_digest: str | None = None, backend: str | None = None,
                   target: str | None = None, limit: int = 200) -> list[Artifact]:
    q = select(Artifact).order_by(Artifact.created_at.desc(), Artifact.id.desc()).limit(limit)
    if model_digest:
        q = q.where(Artifact.model_digest == model_digest)
    if backend:
        q = q.where(Artifact.backend == backend)
    if target:
        q = q.where(Artifact.target == target)
    return list(session.scalars(q))


def counts(session: Session) -> dict[str, int]:
    """Row counts per table (used by tests and `farm registry stats`)."""
    out = {}
    for model in (Model, Tag, Build, Artifact, ArtifactFile):
        out[model.__tablename__] = session.scalar(select(func.count()).select_from(model)) or 0
    out["builds_unfinished"] = session.scalar(
        select(func.count()).select_from(Build).where(or_(Build.state == "queued", Build.state == "running"))) or 0
    return out


# ---- signatures and compatibility evidence --------------------------------------------------------

def add_signature(session: Session, artifact_digest: str, public_b64: str, signature_b64: str) -> None:
    from registry.models import Signature
    from registry.signing import key_id

    kid = key_id(public_b64)
    exists = session.scalar(select(Signature).where(Signature.artifact_digest == artifact_digest,
                                                    Signature.key_id == kid))
    if exists is None:
        session.add(Signature(artifact_digest=artifact_digest, key_id=kid, public_key=public_b64,
                              signature=signature_b64))


def signatures_of(session: Session, artifact_digest: str) -> list[tuple[str, str]]:
    from registry.models import Signature

    return [(s.public_key, s.signature) for s in session.scalars(
        select(Signature).where(Signature.artifact_digest == artifact_digest).order_by(Signature.id))]


def record_verdict(session: Session, artifact_id: int, runtime_backend: str, runtime_version: str, verdict: str,
                   source: str, detail: str | None = None) -> None:
    """Insert or update one piece of compatibility evidence."""
    from registry.models import CompatVerdict

    row = session.scalar(select(CompatVerdict).where(
        CompatVerdict.artifact_id == artifact_id, CompatVerdict.runtime_backend == runtime_backend,
        CompatVerdict.runtime_version == runtime_version, CompatVerdict.source == source))
    if row is None:
        session.add(CompatVerdict(artifact_id=artifact_id, runtime_backend=runtime_backend,
                                  runtime_version=runtime_version, verdict=verdict, source=source, detail=detail))
    else:
        row.verdict, row.detail, row.recorded_at = verdict, detail, now()


def verdicts_for(session: Session, artifact_ids: list[int], runtime_backend: str) -> dict[tuple[int, str], Any]:
    """(artifact id, runtime version) -> probe CompatVerdict, for the given artifacts."""
    from registry.models import CompatVerdict

    if not artifact_ids:
        return {}
    rows = session.scalars(select(CompatVerdict).where(
        CompatVerdict.artifact_id.in_(artifact_ids), CompatVerdict.runtime_backend == runtime_backend,
        CompatVerdict.source == "probe"))
    return {(r.artifact_id, r.runtime_version): r for r in rows}


# ---- cluster: workers, queued builds, releases ------------------------------------------------------

def register_worker(session: Session, *, name: str, host: str, pid: int, toolchain: Any, queues: list[str],
                    extra: dict[str, Any] | None = None) -> int:
    from registry.models import Worker

    row = Worker(name=name, host=host, pid=pid, backend=toolchain.backend, toolchain=toolchain.version,
                 ort_version=toolchain.ort_version, ep_package=toolchain.ep_package, ep_version=toolchain.ep_version,
                 queues=queues, extra=extra or {})
    session.add(row)
    session.flush()
    return row.id


def heartbeat(session: Session, worker_id: int, *, jobs_done_delta: int = 0, stopped: bool = False) -> None:
    from registry.models import Worker

    values: dict[str, Any] = {"last_seen": now()}
    if jobs_done_delta:
        values["jobs_done"] = Worker.jobs_done + jobs_done_delta
    if stopped:
        values["stopped_at"] = now()
    session.execute(update(Worker).where(Worker.id == worker_id).values(**values)
                    .execution_options(synchronize_session=False))


def live_workers(session: Session, *, stale_after: float) -> list[Any]:
    from registry.models import Worker

    cutoff = now() - timedelta(seconds=stale_after)
    return list(session.scalars(select(Worker).where(Worker.stopped_at.is_(None), Worker.last_seen >= cutoff)
                                .order_by(Worker.backend, Worker.toolchain, Worker.name)))


def all_workers(session: Session, limit: int = 200) -> list[Any]:
    from registry.models import Worker

    return list(session.scalars(select(Worker).order_by(Worker.last_seen.desc()).limit(limit)))


def queue_build(session: Session, spec: BuildSpec, queue: str) -> tuple[int, bool]:
    """Insert a queued build row (the UNIQUE key dedupes). Returns (build id, needs a message):
    a new row, or an existing one that is waiting or failed for an infrastructure reason."""
    row = session.scalar(select(Build).where(Build.build_key == spec.build_key))
    if row is None:
        row = Build(build_key=spec.build_key, model_digest=spec.model_digest, backend=spec.backend,
                    target=spec.target, toolchain=spec.toolchain, options=spec.options,
                    options_digest=spec.options_digest, state="queued", attempts=0, queue=queue, enqueued_at=now())
        try:
            with session.begin_nested():
                session.add(row)
            return row.id, True
        except IntegrityError:
            row = session.scalar(select(Build).where(Build.build_key == spec.build_key))
            assert row is not None
            return row.id, False  # a concurrent submitter inserted it and sends its message
    if row.state == "failed" and row.error_code not in DETERMINISTIC_FAILURES:
        # Infrastructure failure: a new submission is a new chance, with a fresh attempt budget.
        session.execute(update(Build).where(Build.id == row.id, Build.state == "failed")
                        .values(state="queued", attempts=0, error_code=None, error_message=None, queue=queue,
                                enqueued_at=now(), finished_at=None)
                        .execution_options(synchronize_session=False))
        return row.id, True
    return row.id, False


def stale_queued(session: Session, queues: list[str], older_than: float, limit: int = 100) -> list[tuple[int, str]]:
    """Builds on these queues whose message may be lost: queued with a message older than
    ``older_than`` seconds (a broker that lost its lists), or running under an expired lease (a
    dead worker; Redis would redeliver only after its visibility timeout). Their enqueued_at is
    bumped so only one reconciler re-sends each, once per ``older_than``."""
    t = now()
    cutoff = t - timedelta(seconds=older_than)
    orphaned = or_(Build.state == "queued", (Build.state == "running") & (Build.lease_expires_at < t))
    rows = session.execute(select(Build.id, Build.queue).where(orphaned, Build.queue.in_(queues),
                                                                Build.enqueued_at < cutoff).limit(limit)).all()
    taken = []
    for build_id, queue in rows:
        n = _changed(session, update(Build).where(Build.id == build_id, orphaned, Build.enqueued_at < cutoff)
                     .values(enqueued_at=now()))
        if n:
            taken.append((build_id, str(queue)))  # the filter on queue rules out NULL
    return taken


def start_build(session: Session, build_id: int, *, owner: str, lease_seconds: float, max_attempts: int) -> str:
    """A worker's claim on a delivered build. Returns ``run`` (ours now), ``done`` (nothing to
    do), ``busy`` (another worker holds a live lease) or ``exhausted`` (attempt cap reached:
    the row is now failed with worker-lost)."""
    row = get_build(session, build_id)
    if row.state == "succeeded" or (row.state == "failed" and row.error_code in DETERMINISTIC_FAILURES):
        return "done"
    if row.state == "failed" and row.attempts >= max_attempts:
        return "done"
    lease = _aware(row.lease_expires_at)
    if row.state == "running" and lease is not None and lease > now():
        return "busy"
    if row.attempts >= max_attempts:
        # Every attempt so far died with its worker (a poison model, or a flaky host).
        fail_build(session, row.id, "worker-lost",
                   f"gave up after {row.attempts} attempt(s): the compiling worker was lost each time", row.log)
        return "exhausted"
    taken = _changed(session,
        update(Build).where(Build.id == row.id, Build.attempts == row.attempts, Build.state == row.state)
        .values(state="running", attempts=row.attempts + 1, lease_owner=owner,
                lease_expires_at=now() + timedelta(seconds=lease_seconds), started_at=now(), worker=owner))
    return "run" if taken == 1 else "busy"


def renew_lease(session: Session, build_id: int, owner: str, lease_seconds: float) -> bool:
    return bool(_changed(session,
        update(Build).where(Build.id == build_id, Build.lease_owner == owner, Build.state == "running")
        .values(lease_expires_at=now() + timedelta(seconds=lease_seconds))))


def requeue_after_failure(session: Session, build_id: int, code: str, message: str, log: str | None) -> None:
    """An infrastructure failure with attempts left: back to queued, the error kept for status."""
    session.execute(update(Build).where(Build.id == build_id)
                    .values(state="queued", error_code=code, error_message=message, log=log, lease_owner=None,
                            lease_expires_at=None, enqueued_at=now())
                    .execution_options(synchronize_session=False))


def release_builds(session: Session, release_id: int) -> list[Build]:
    from registry.models import ReleaseBuild

    return list(session.scalars(select(Build).join(ReleaseBuild, ReleaseBuild.build_id == Build.id)
                                .where(ReleaseBuild.release_id == release_id).order_by(Build.target, Build.toolchain)))
