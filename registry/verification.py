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
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

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
    artifact the agent runs (``KINDS``; default one context, what every agent runs)."""
    from farm.core.keys import parse_version
    from registry.models import Model, ModelSample

    now = datetime.now(UTC)
    wanted = [device.soc] if not device.simulator else socs
    # Never a second job of a cell (artifact, SoC) this device holds or reported: in the query, so
    # a device that did many cells still finds the open ones.
    held = aliased(VerificationJob)
    held_cell = exists().where(held.device_id == device.id, held.artifact_id == VerificationJob.artifact_id,
                               held.soc == VerificationJob.soc)
    reported_cell = exists().where(DeviceVerification.device_id == device.id,
                                   DeviceVerification.artifact_id == VerificationJob.artifact_id,
                                   DeviceVerification.soc == VerificationJob.soc)
    open_ = or_(VerificationJob.state == "queued",
                and_(VerificationJob.state == "leased", VerificationJob.lease_until < now))
    query = (select(VerificationJob, Artifact).join(Artifact, Artifact.id == VerificationJob.artifact_id)
             .where(open_, Artifact.status == "active", ~held_cell, ~reported_cell)
             .order_by(VerificationJob.id).limit(50))
    if wanted:
        query = query.where(VerificationJob.soc.in_(wanted))
    answered: dict[tuple[str, str], int | None] = {}  # (model, SoC) -> what resolve answers this runtime
    unknown = set(kinds or ()) - set(KINDS)
    if unknown:
        raise UsageError(f"kinds: {sorted(unknown)[:3]} are not artifact kinds ({', '.join(KINDS)})")
    query = query.where(_kind_clause(list(kinds or ["context"])))
    for job, art in session.execute(query).all():
        if runtime and parse_version(art.toolchain) > parse_version(runtime):
            continue
        if runtime and _answered(session, answered, art.model_digest, job.soc, runtime, prefer_fastest) != art.id:
            continue
        nonce = secrets.token_hex(16)
        until = now + timedelta(seconds=lease_s)
        # Guarded: the row is still open as read; of two agents, one changes it.
        took = session.execute(
            update(VerificationJob).where(VerificationJob.id == job.id, VerificationJob.state == job.state,
                                          VerificationJob.attempts == job.attempts, open_)
            .values(state="leased", device_id=device.id, nonce=nonce, lease_until=until,
                    attempts=VerificationJob.attempts + 1).execution_options(synchronize_session=False))
        if took.rowcount != 1:  # type: ignore[attr-defined]
            continue
        model = session.get(Model, art.model_digest)
        files = [{"path": f["path"], "digest": f["digest"], "size": f["size"]} for f in (model.files if model else [])]
        sample = session.get(ModelSample, art.model_digest)
        samples = {"digest": sample.digest, "size": sample.size} if sample is not None else None
        kind = kind_of(art.ctx_model)
        reference, why = _reference(sample)
        tokens = None
        if kind == "genai-package":
            tokens, why = _reference_tokens(art)
        return Lease(job.id, nonce, art.digest, art.model_digest, job.soc, art.target, art.toolchain, until, files,
                     lease_s, samples, reference, why, kind, tokens)
    return None


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


def _reference_tokens(art: Artifact) -> tuple[dict[str, Any] | None, str | None]:
    """A genai package's reference for a device: the twin's prompt and CPU tokens, or why none."""
    twin = (art.description or {}).get("twin") if isinstance(art.description, dict) else None
    tokens = twin.get("reference_tokens") if isinstance(twin, dict) else None
    if isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens) and \
            isinstance(twin.get("prompt"), str):  # type: ignore[union-attr]
        return {"prompt": twin["prompt"][:4000], "tokens": tokens[:MAX_REFERENCE_TOKENS]}, None  # type: ignore[index]
    status = twin.get("status") if isinstance(twin, dict) else None
    return None, (f"the package's twin is {status}: no reference tokens yet" if status
                  else "the package was built without its twin (--no-twin): no reference tokens")


def _reference(sample: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The lease's reference blob (digest, size), or why it names none."""
    if sample is None:
        return None, "the model has no sample inputs (the farm keeps a reference only for those)"
    if sample.reference_digest and sample.reference_size is not None:
        return {"digest": sample.reference_digest, "size": int(sample.reference_size)}, None
    return None, sample.reference_why or "no CPU reference is kept for these samples yet (no accuracy check ran on them)"


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
    row = DeviceVerification(job_id=job.id, device_id=device.id, artifact_id=job.artifact_id, soc=job.soc,
                             simulator=device.simulator, nonce=body["nonce"], outcome=body["outcome"],
                             body=body, signature=str(signature)[:128], **{k: body.get(k) for k in NUMBERS})
    closed = session.execute(
        update(VerificationJob).where(VerificationJob.id == job.id, VerificationJob.state == "leased",
                                      VerificationJob.device_id == device.id, VerificationJob.nonce == body["nonce"])
        .values(state="done", done_at=datetime.now(UTC)).execution_options(synchronize_session=False))
    if closed.rowcount != 1:  # type: ignore[attr-defined]
        raise ReportReplayedError(f"job {job_id} was taken over meanwhile")
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        raise ReportReplayedError(f"job {job_id} already has its report") from None
    return row, True


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
