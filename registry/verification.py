"""Verification jobs and the signed reports that close them.

A job asks for artifact X to be run on a device of SoC Y. An agent leases it (a guarded UPDATE: of
two agents asking at once one wins; a lease that ran out goes to the next agent, with a fresh
nonce), runs it and posts a report: ``body`` (canonical JSON text holding the job id and the
lease's nonce) and an Ed25519 ``signature`` over ``DOMAIN + body`` by the key its device enrolled.
The service checks, in order: the device (not revoked), the signature, the body's shape, that the
job's lease is this device's and this nonce (else ``report-replayed``), that the SoC is the one it
enrolled (a simulator may verify any SoC, and is recorded as one). The first accepted report
closes the job; the same signed report posted again answers the same row (idempotent).
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from sqlalchemy import DateTime, Integer, Table, and_, bindparam, exists, func, literal_column, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from farm.core.errors import (
    NotFoundError,
    ReportReplayedError,
    ReportSignatureError,
    ReportSocMismatchError,
    UsageError,
)
from farm.core.signed_reports import canonical, message
from registry.models import Artifact, Device, DeviceVerification, VerificationJob

LEASE_S = 600  # an agent that took a job and went silent for this long loses it to the next one
MAX_BODY = 16 * 1024
OUTCOMES = ("ok", "fails", "crashed")
NUMBERS = ("psnr_db", "load_ms", "first_inference_ms", "p50_ms", "peak_memory_mb")
# The most each figure can be: a report past it is refused, not stored (its medians are shown and
# compared across SDKs). PSNR: the agent records identical outputs as 200 dB (JSON has no
# infinity); times: a day; memory: 16 TiB.
DAY_MS = 86_400_000.0
NUMBER_MAX = {"psnr_db": 200.0, "load_ms": DAY_MS, "first_inference_ms": DAY_MS, "p50_ms": DAY_MS,
              "peak_memory_mb": 16 * 1024 * 1024.0}
MAX_RUNS = 1_000_000
TEXTS = {"runtime": 64, "error": 4000, "inputs": 80, "reference": 16, "reference_why": 300}
REFERENCES = ("stored", "device-cpu")  # body.reference: the farm's kept CPU outputs, or the device's own CPU
COUNTS = ("tokens_compared", "tokens_matched")  # an LLM package's report: greedy tokens against the twin's reference
BODY_KEYS = {"job", "nonce", "device", "artifact", "soc", "outcome", "runs", *NUMBERS, *TEXTS, *COUNTS}
# What an artifact is, for an agent (docs/device-lab.md), read from its fixed ctx_model stem: a
# genai package's genai_config.json, a graph group's first graph g0_ctx.onnx
# (workers.qnn.runner), anything else one context. An agent says which kinds it runs.
KINDS = ("context", "group", "genai-package")
GENAI_CTX_MODEL = "genai_config.json"
GROUP_CTX_MODEL = "g0_ctx.onnx"
MAX_REFERENCE_TOKENS = 4096
LEASE_PAGE = 50  # open jobs a lease reads at once when it checks each against resolve's answer
_JOBS: Table = VerificationJob.__table__  # type: ignore[assignment]  # Core, not ORM entities: a lease and a report read and write few columns
_ARTS: Table = Artifact.__table__  # type: ignore[assignment]


def kind_of(ctx_model: str | None) -> str:
    return "genai-package" if ctx_model == GENAI_CTX_MODEL else "group" if ctx_model == GROUP_CTX_MODEL else "context"


def _kind_clause(kinds: list[str]) -> Any:
    parts = {"genai-package": Artifact.ctx_model == GENAI_CTX_MODEL, "group": Artifact.ctx_model == GROUP_CTX_MODEL,
             "context": Artifact.ctx_model.notin_([GENAI_CTX_MODEL, GROUP_CTX_MODEL])}
    return or_(*(parts[k] for k in kinds))


# ---- jobs -----------------------------------------------------------------------------------------

def ensure_jobs(session: Session, artifact_id: int, soc: str, slots: int) -> int:
    """Jobs 1..``slots`` for (artifact, SoC): each is done by a distinct device. Returns how many were
    made (an existing slot is kept, done or not: a job's result stands)."""
    have = set(session.scalars(select(VerificationJob.slot).where(VerificationJob.artifact_id == artifact_id,
                                                                  VerificationJob.soc == soc)))
    made = 0
    for slot in range(1, slots + 1):
        if slot in have:
            continue
        try:
            with session.begin_nested():
                session.add(VerificationJob(artifact_id=artifact_id, soc=soc, slot=slot))
            made += 1
        except IntegrityError:  # another promote made it meanwhile: the same job
            pass
    return made


@dataclass(frozen=True)
class Lease:
    job_id: int
    nonce: str
    artifact: str
    model_digest: str
    soc: str
    target: str
    toolchain: str
    lease_until: datetime
    model_files: list[dict[str, Any]]
    lease_s: int = LEASE_S
    samples: dict[str, Any] | None = None  # the submitter's sample inputs (an .npz blob), if the model has them
    # The farm's CPU reference outputs for those samples (an .npz blob: registry.models.ModelSample);
    # None with ``reference_why`` saying why: the agent then computes its own on the device's CPU.
    reference: dict[str, Any] | None = None
    reference_why: str | None = None
    kind: str = "context"
    # A genai package's reference: the twin's greedy tokens for its prompt ({"prompt", "tokens"}),
    # generated from the source pipeline on the CPU EP when the package was built.
    reference_tokens: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job_id, "nonce": self.nonce, "artifact": self.artifact, "model": self.model_digest,
                "soc": self.soc, "target": self.target, "toolchain": self.toolchain,
                "lease_until": self.lease_until.isoformat(), "lease_s": self.lease_s, "model_files": self.model_files,
                "samples": self.samples, "reference": self.reference, "reference_why": self.reference_why,
                "kind": self.kind, "reference_tokens": self.reference_tokens}


def lease(session: Session, device: Device, socs: list[str] | None = None, *, runtime: str | None = None,
          lease_s: int = LEASE_S, prefer_fastest: bool = False, kinds: list[str] | None = None) -> Lease | None:
    """Take one job this device may do, or None. A device of SoC Y takes Y's jobs; a simulator any
    SoC's (``socs`` narrows it). Never a second job of a cell (artifact, SoC) the device already
    reported on or holds. ``runtime``: the agent's QNN version; an artifact built with a newer SDK
    is not offered, nor one resolve does not answer that runtime (the agent installs through
    resolve and leaves a job whose artifact it is not answered: jobs on several SDKs' artifacts
    go each to agents of the runtime resolve answers it; ``prefer_fastest``: the service's
    FARM_RESOLVE_PREFER_FASTEST, as its resolve answers the agent). ``kinds``: the kinds of
    artifact the agent runs (``KINDS``; default one context, what every agent runs).

    The open jobs are read in id order by the partial index of open jobs, a page at a time from
    where the last page ended, until one is taken or none is left: a job the device may take is
    found wherever it is in the queue, and each job is read at most once. Without ``runtime``
    every row the query answers is one the device may take: one row, locked as it is read on
    PostgreSQL and skipping rows another agent's lease holds (``FOR UPDATE SKIP LOCKED``), so
    agents asking at once take different jobs without waiting on each other."""
    from farm.core.keys import parse_version

    unknown = set(kinds or ()) - set(KINDS)
    if unknown:
        raise UsageError(f"kinds: {sorted(unknown)[:3]} are not artifact kinds ({', '.join(KINDS)})")
    now = datetime.now(UTC)
    wanted = [device.soc] if not device.simulator else socs
    lock = not runtime and session.get_bind().dialect.name == "postgresql"
    query = _open_jobs(tuple(sorted(set(kinds or ["context"]))), bool(wanted), LEASE_PAGE if runtime else 1, lock)
    conn = session.connection()
    answered: dict[tuple[str, str], int | None] = {}  # (model, SoC) -> what resolve answers this runtime
    after = 0
    while True:
        rows = conn.execute(query, {"device": device.id, "now": now, "after": after, "socs": wanted or []}).all()
        if not rows:
            return None
        for row in rows:
            after = row.id
            if runtime and (parse_version(row.toolchain) > parse_version(runtime) or _answered(
                    session, answered, row.model_digest, row.soc, runtime, prefer_fastest) != row.artifact_id):
                continue
            got = _take(session, device, row, now, lease_s)
            if got is not None:
                return got


# The statements of a lease and a report are built once (per variant) with bound parameters:
# building SQLAlchemy expressions costs more CPU than running them.

@lru_cache(maxsize=32)
def _open_jobs(kinds: tuple[str, ...], narrowed: bool, page: int, lock: bool) -> Any:
    """The open jobs a device (``:device``) may take as far as SQL can tell, in id order past
    ``:after``, ``page`` at once, with what a lease names (the artifact, the model's files, its
    samples and reference): one statement. ``narrowed``: of the SoCs ``:socs`` only. ``lock``
    (PostgreSQL): the rows locked as read, skipping those another transaction holds."""
    from registry.models import Model, ModelSample

    held = _JOBS.alias("held")
    reports = DeviceVerification.__table__
    samples = ModelSample.__table__
    models = Model.__table__
    device = bindparam("device", type_=Integer)
    query = (select(_JOBS.c.id, _JOBS.c.state, _JOBS.c.attempts, _JOBS.c.soc, _JOBS.c.artifact_id,
                    _ARTS.c.digest, _ARTS.c.model_digest, _ARTS.c.target, _ARTS.c.toolchain, _ARTS.c.ctx_model,
                    models.c.files, samples.c.digest.label("sample_digest"), samples.c.size.label("sample_size"),
                    samples.c.reference_digest, samples.c.reference_size, samples.c.reference_why)
             .select_from(_JOBS.join(_ARTS, _ARTS.c.id == _JOBS.c.artifact_id)
                          .outerjoin(models, models.c.digest == _ARTS.c.model_digest)
                          .outerjoin(samples, samples.c.model_digest == _ARTS.c.model_digest))
             # The literal is the partial index's predicate (ix_verification_jobs_open): a bound
             # parameter would hide it from a prepared statement's generic plan.
             .where(_JOBS.c.state != literal_column("'done'"), _JOBS.c.id > bindparam("after", type_=Integer),
                    _open(bindparam("now", type_=DateTime(timezone=True))), _ARTS.c.status == "active",
                    _kind_clause(list(kinds)),
                    # Never a second job of a cell (artifact, SoC) this device holds or reported.
                    ~exists().where(held.c.device_id == device, held.c.artifact_id == _JOBS.c.artifact_id,
                                    held.c.soc == _JOBS.c.soc),
                    ~exists().where(reports.c.device_id == device, reports.c.artifact_id == _JOBS.c.artifact_id,
                                    reports.c.soc == _JOBS.c.soc))
             .order_by(_JOBS.c.id).limit(page))
    if narrowed:
        query = query.where(_JOBS.c.soc.in_(bindparam("socs", expanding=True)))
    if lock:
        query = query.with_for_update(of=_JOBS, skip_locked=True)
    return query


def _open(now: Any) -> Any:
    """A job another agent may take: queued, or leased and the lease ran out."""
    return or_(_JOBS.c.state == "queued", and_(_JOBS.c.state == "leased", _JOBS.c.lease_until < now))


@lru_cache(maxsize=1)
def _take_stmt() -> Any:
    # Guarded: the row is still open as read; of two agents, one changes it.
    return (update(_JOBS).where(_JOBS.c.id == bindparam("job"), _JOBS.c.state == bindparam("was"),
                                _JOBS.c.attempts == bindparam("tries"), _open(bindparam("now")))
            .values(state="leased", device_id=bindparam("device"), nonce=bindparam("new_nonce"),
                    lease_until=bindparam("until"), attempts=_JOBS.c.attempts + 1))


def _take(session: Session, device: Device, row: Any, now: datetime, lease_s: int) -> Lease | None:
    """Lease the job of ``row`` (one of ``_open_jobs``) to ``device``; None when another agent
    took it since it was read."""
    nonce = secrets.token_hex(16)
    until = now + timedelta(seconds=lease_s)
    took = session.connection().execute(_take_stmt(), {"job": row.id, "was": row.state, "tries": row.attempts,
                                                       "now": now, "device": device.id, "new_nonce": nonce,
                                                       "until": until})
    if took.rowcount != 1:
        return None
    files = [{"path": f["path"], "digest": f["digest"], "size": f["size"]} for f in (row.files or [])]
    samples = {"digest": row.sample_digest, "size": row.sample_size} if row.sample_digest is not None else None
    kind = kind_of(row.ctx_model)
    reference, why = _reference(samples is not None, row.reference_digest, row.reference_size, row.reference_why)
    tokens = None
    if kind == "genai-package":  # only a package reads its description (the twin's tokens)
        tokens, why = _reference_tokens(session.scalar(select(_ARTS.c.description).where(_ARTS.c.id == row.artifact_id)))
    return Lease(row.id, nonce, row.digest, row.model_digest, row.soc, row.target, row.toolchain, until, files,
                 lease_s, samples, reference, why, kind, tokens)


def _answered(session: Session, seen: dict[tuple[str, str], int | None], model: str, soc: str, runtime: str,
              prefer_fastest: bool) -> int | None:
    """The id of the artifact resolve answers a device of ``soc`` running QNN ``runtime`` (None:
    none), once per (model, SoC) in one lease: the open jobs of one model share it."""
    from farm.core.catalog import load_catalog
    from farm.core.errors import FarmError
    from registry.resolve import Device as Asking
    from registry.resolve import resolve

    if (model, soc) not in seen:
        try:
            chosen, _ = resolve(session, model, Asking("qnn", load_catalog().get(soc, backend="qnn"), runtime),
                                prefer_fastest=prefer_fastest)
            seen[(model, soc)] = chosen.id
        except FarmError:  # nothing served there: not this agent's job
            seen[(model, soc)] = None
    return seen[(model, soc)]


def _reference_tokens(description: Any) -> tuple[dict[str, Any] | None, str | None]:
    """A genai package's reference for a device (from its artifact's ``description``): the twin's
    prompt and CPU tokens, or why none."""
    twin = description.get("twin") if isinstance(description, dict) else None
    tokens = twin.get("reference_tokens") if isinstance(twin, dict) else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens) and \
            isinstance(twin.get("prompt"), str):  # type: ignore[union-attr]
        return {"prompt": twin["prompt"][:4000], "tokens": tokens[:MAX_REFERENCE_TOKENS]}, None  # type: ignore[index]
    status = twin.get("status") if isinstance(twin, dict) else None
    return None, (f"the package's twin is {status}: no reference tokens yet" if status
                  else "the package was built without its twin (--no-twin): no reference tokens")


def _reference(has_samples: bool, digest: str | None, size: int | None, why: str | None
               ) -> tuple[dict[str, Any] | None, str | None]:
    """The lease's reference blob (digest, size), or why it names none."""
    if not has_samples:
        return None, "the model has no sample inputs (the farm keeps a reference only for those)"
    if digest and size is not None:
        return {"digest": digest, "size": int(size)}, None
    return None, why or "no CPU reference is kept for these samples yet (no accuracy check ran on them)"


def renew(session: Session, device: Device, job_id: int, nonce: Any, *, lease_s: int = LEASE_S) -> datetime:
    """Extend this device's lease of ``job_id`` (the nonce it was given); ``lease-lost`` when the
    lease is not its own any more (it ran out and another agent took it, the job is done)."""
    from farm.core.errors import LeaseLostError

    until = datetime.now(UTC) + timedelta(seconds=lease_s)
    kept = session.execute(
        update(VerificationJob).where(VerificationJob.id == job_id, VerificationJob.state == "leased",
                                      VerificationJob.device_id == device.id, VerificationJob.nonce == str(nonce)[:64])
        .values(lease_until=until).execution_options(synchronize_session=False))
    if kept.rowcount != 1:  # type: ignore[attr-defined]
        raise LeaseLostError(f"job {job_id} is not leased to {device.name} with this nonce any more",
                             hint="the agent stops renewing; its report would be refused (report-replayed)")
    return until


# ---- reports --------------------------------------------------------------------------------------

def verify_signature(public_b64: str, body_text: str, signature_b64: Any) -> None:
    from registry.signing import _crypto

    _, ed25519 = _crypto()  # missing-extra without the cryptography package
    from cryptography.exceptions import InvalidSignature

    try:
        sig = base64.b64decode(signature_b64, validate=True) if isinstance(signature_b64, str) else b""
        ed25519.Ed25519PublicKey.from_public_bytes(base64.b64decode(public_b64)).verify(sig, message(body_text))
    except (InvalidSignature, ValueError):
        raise ReportSignatureError("the report's signature does not verify with the key this device enrolled") \
            from None


def parse_body(body_text: Any) -> dict[str, Any]:
    """The report body, its shape checked (after its signature: nothing unsigned is parsed)."""
    from farm.core.text import unprintable

    if not isinstance(body_text, str) or len(body_text) > MAX_BODY:
        raise UsageError(f"body: the canonical report text, at most {MAX_BODY} characters")
    try:
        body = json.loads(body_text)
    except ValueError:
        raise UsageError("body is not JSON") from None
    if not isinstance(body, dict) or set(body) - BODY_KEYS:
        raise UsageError(f"body: an object with the keys {', '.join(sorted(BODY_KEYS))}")
    for key in ("job", "nonce", "device", "artifact", "soc", "outcome"):
        if key not in body:
            raise UsageError(f"body.{key} is required")
    if not isinstance(body["job"], int) or isinstance(body["job"], bool):
        raise UsageError("body.job: the job id")
    if body["outcome"] not in OUTCOMES:
        raise UsageError(f"body.outcome: one of {', '.join(OUTCOMES)}")
    for key in NUMBERS:
        v = body.get(key)
        # A comparison, not math.isfinite: NaN and the infinities fail it, and an integer of 400
        # digits (JSON has them) is compared exactly instead of overflowing a float conversion.
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= NUMBER_MAX[key]):
            raise UsageError(f"body.{key}: a number from 0 to {NUMBER_MAX[key]:g}")
    runs = body.get("runs")
    if runs is not None and (isinstance(runs, bool) or not isinstance(runs, int) or not 0 <= runs <= MAX_RUNS):
        raise UsageError(f"body.runs: a whole number from 0 to {MAX_RUNS}")
    for key in ("nonce", "device", "artifact", "soc"):
        if not isinstance(body[key], str) or len(body[key]) > 255:
            raise UsageError(f"body.{key}: a string")
    for key, cap in TEXTS.items():
        v = body.get(key)
        if v is not None and (not isinstance(v, str) or len(v) > cap or unprintable(v) is not None):
            raise UsageError(f"body.{key}: printable text of at most {cap} characters")
    for key in COUNTS:
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_REFERENCE_TOKENS):
            raise UsageError(f"body.{key}: a whole number from 0 to {MAX_REFERENCE_TOKENS}")
    if (body.get("tokens_matched") or 0) > (body.get("tokens_compared") or 0):
        raise UsageError("body.tokens_matched: at most tokens_compared")
    if body.get("reference") is not None and body["reference"] not in REFERENCES:
        raise UsageError(f"body.reference: one of {', '.join(REFERENCES)}")
    if canonical(body) != body_text:
        raise UsageError("body is not in canonical form (sorted keys, no spaces, ASCII)")
    return body


def accept(session: Session, device: Device, job_id: int, body_text: Any, signature: Any) -> tuple[DeviceVerification, bool]:
    """Record a signed report for ``job_id`` from ``device`` (the bearer token's). Returns (row,
    created): the same signed report again answers its row, ``created`` False."""
    if not device.public_key:
        raise ReportSignatureError("this device has no enrolled key")
    verify_signature(device.public_key, body_text if isinstance(body_text, str) else "", signature)
    body = parse_body(body_text)
    if body["job"] != job_id or body["device"] != device.name:
        raise ReportReplayedError("the signed report is for another job or another device")
    now = datetime.now(UTC)
    if device.simulator or body["soc"] == device.soc:
        # The common case in one statement: the job is leased to this device with this nonce, on
        # the SoC and artifact the report names; closing it is every check below passed at once
        # (a nonce is reported only as its job closes). Anything else changes nothing here and
        # is told apart below, in the order the checks are documented.
        closed = session.connection().execute(_close_stmt(), {
            "job": job_id, "device": device.id, "leased_nonce": body["nonce"], "job_soc": body["soc"],
            "artifact": body["artifact"], "now": now}).first()
        if closed is not None:
            return _record(session, device, job_id, closed.artifact_id, body, signature, now), True
    same = session.scalar(select(DeviceVerification).where(DeviceVerification.nonce == body["nonce"]))
    if same is not None:
        if same.job_id == job_id and same.device_id == device.id and same.signature == signature:
            return same, False
        raise ReportReplayedError("this nonce was already reported on")
    job = session.get(VerificationJob, job_id)
    if job is None:
        raise NotFoundError(f"no verification job {job_id}")
    if job.state != "leased" or job.device_id != device.id or job.nonce != body["nonce"]:
        raise ReportReplayedError(f"job {job_id}'s lease is not this device's with this nonce (it ran out and went "
                                  "to another agent, or the job is done)")
    if not device.simulator and body["soc"] != device.soc:
        raise ReportSocMismatchError(f"device {device.name!r} enrolled as {device.soc}, the report says {body['soc']}")
    art = session.get(Artifact, job.artifact_id)
    if body["soc"] != job.soc or art is None or body["artifact"] != art.digest:
        raise ReportSocMismatchError(f"job {job_id} is {job.soc} on {art.digest if art else '?'}; the report is "
                                     f"{str(body['soc'])[:64]} on {str(body['artifact'])[:71]}")
    done = session.connection().execute(
        update(_JOBS).where(_JOBS.c.id == job.id, _JOBS.c.state == "leased", _JOBS.c.device_id == device.id,
                            _JOBS.c.nonce == body["nonce"]).values(state="done", done_at=now))
    if done.rowcount != 1:
        raise ReportReplayedError(f"job {job_id} was taken over meanwhile")
    return _record(session, device, job.id, job.artifact_id, body, signature, now), True


@lru_cache(maxsize=1)
def _close_stmt() -> Any:
    return (update(_JOBS).where(_JOBS.c.id == bindparam("job"), _JOBS.c.state == "leased",
                                _JOBS.c.device_id == bindparam("device"), _JOBS.c.nonce == bindparam("leased_nonce"),
                                _JOBS.c.soc == bindparam("job_soc"),
                                _JOBS.c.artifact_id == select(_ARTS.c.id).where(_ARTS.c.digest == bindparam("artifact"))
                                .scalar_subquery())
            .values(state="done", done_at=bindparam("now")).returning(_JOBS.c.artifact_id))


def _record(session: Session, device: Device, job_id: int, artifact_id: int, body: dict[str, Any],
            signature: Any, now: datetime) -> DeviceVerification:
    """The report's row, inserted in the transaction that closed its job (one statement, not a
    flush of the unit of work) and handed back as a row of the session."""
    from sqlalchemy.orm import make_transient_to_detached

    values = {"job_id": job_id, "device_id": device.id, "artifact_id": artifact_id, "soc": body["soc"],
              "simulator": device.simulator, "nonce": body["nonce"], "outcome": body["outcome"], "body": body,
              "signature": str(signature)[:128], "created_at": now, **{k: body.get(k) for k in NUMBERS}}
    try:
        new_id = session.connection().execute(_insert_report_stmt(), values).scalar_one()
    except IntegrityError:  # its job or its nonce has a report already: the transaction is refused whole
        raise ReportReplayedError(f"job {job_id} already has its report") from None
    row = DeviceVerification(id=new_id, struck_at=None, struck_why=None, **values)
    make_transient_to_detached(row)
    session.add(row)
    return row


@lru_cache(maxsize=1)
def _insert_report_stmt() -> Any:
    table: Table = DeviceVerification.__table__  # type: ignore[assignment]
    return table.insert().returning(table.c.id)


def view(row: DeviceVerification, device_name: str | None = None) -> dict[str, Any]:
    from farm.core.times import iso

    return {"id": row.id, "job": row.job_id, "device": device_name, "soc": row.soc, "simulator": row.simulator,
            "outcome": row.outcome, **{k: getattr(row, k) for k in NUMBERS}, "inputs": (row.body or {}).get("inputs"),
            "reference": (row.body or {}).get("reference"),
            **{k: (row.body or {})[k] for k in COUNTS if k in (row.body or {})},
            "at": iso(row.created_at), "struck": row.struck_why}


# ---- evidence -------------------------------------------------------------------------------------

def evidence(session: Session, artifact_ids: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """Per SoC: the live (not struck) verifications of its artifact, with the device's name."""
    out: dict[str, list[dict[str, Any]]] = {soc: [] for soc in artifact_ids}
    for soc, art_id in artifact_ids.items():
        rows = session.execute(select(DeviceVerification, Device.name)
                               .join(Device, Device.id == DeviceVerification.device_id)
                               .where(DeviceVerification.artifact_id == art_id, DeviceVerification.soc == soc,
                                      DeviceVerification.struck_at.is_(None), Device.revoked_at.is_(None))
                               .order_by(DeviceVerification.id)).all()
        out[soc] = [view(r, name) for r, name in rows]
    return out


def open_jobs(session: Session, artifact_ids: dict[str, int]) -> dict[str, int]:
    """Per SoC: jobs not done yet."""
    out = {}
    for soc, art_id in artifact_ids.items():
        out[soc] = int(session.scalar(select(func.count()).select_from(VerificationJob).where(
            VerificationJob.artifact_id == art_id, VerificationJob.soc == soc, VerificationJob.state != "done")) or 0)
    return out
