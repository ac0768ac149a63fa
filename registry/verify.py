"""Registry integrity: ``verify`` (every indexed blob present, right size and digest) and ``gc``
(delete blobs no artifact references, older than a grace window)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from farm.core.errors import BlobNotFound, StorageError
from farm.core.keys import sha256_stream
from registry.models import Artifact, ArtifactFile, Model
from registry.store.base import BlobStore


@dataclass
class Problem:
    artifact: str
    file: str
    digest: str
    problem: str  # missing | size | digest | unreadable


@dataclass
class VerifyReport:
    artifacts: int = 0
    blobs: int = 0
    bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    marked_broken: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)  # broken artifacts whose blobs are whole again
    foreign: list[str] = field(default_factory=list)  # entries in the store that are not our blobs

    @property
    def ok(self) -> bool:
        return not self.problems


def _hash_blob(store: BlobStore, digest: str) -> tuple[str, int]:
    with store.open(digest) as f:
        return sha256_stream(f)


def verify(session: Session, store: BlobStore, *, full: bool = True, repair: bool = False,
           include_broken: bool = False) -> VerifyReport:
    """Check every file of every artifact (active ones; broken ones too with ``repair`` or
    ``include_broken``). ``full`` re-hashes content (else size only). ``repair`` marks artifacts
    with a problem ``broken`` (resolve stops serving them, the next build replaces them) and
    clears the mark of broken artifacts whose blobs are whole again. Foreign entries in the
    store are reported, never fatal."""
    report = VerifyReport()
    q = select(Artifact.id, Artifact.digest, ArtifactFile.name, ArtifactFile.digest, ArtifactFile.size,
               Artifact.status).join(
        ArtifactFile, ArtifactFile.artifact_id == Artifact.id).order_by(Artifact.id, ArtifactFile.name)
    if not (include_broken or repair):
        q = q.where(Artifact.status == "active")
    checked: dict[str, str | None] = {}  # blob digest -> problem (a blob shared by artifacts is read once)
    broken: dict[int, str] = {}
    marked: dict[int, str] = {}
    seen_artifacts: set[int] = set()
    for art_id, art_digest, name, digest, size, status in session.execute(q):
        seen_artifacts.add(art_id)
        if status == "broken":
            marked[art_id] = art_digest
        if digest not in checked:
            checked[digest] = _check_blob(store, digest, size, full)
            if checked[digest] is None:
                report.blobs += 1
                report.bytes += size
        problem = checked[digest]
        if problem:
            report.problems.append(Problem(art_digest, name, digest, problem))
            broken[art_id] = art_digest
    report.artifacts = len(seen_artifacts)
    if repair and broken:
        session.execute(update(Artifact).where(Artifact.id.in_(list(broken))).values(status="broken")
                        .execution_options(synchronize_session=False))
        report.marked_broken = sorted(d for i, d in broken.items() if i not in marked)
    whole = [i for i in marked if i not in broken]
    if repair and whole:
        session.execute(update(Artifact).where(Artifact.id.in_(whole), Artifact.status == "broken")
                        .values(status="active").execution_options(synchronize_session=False))
        report.cleared = sorted(marked[i] for i in whole)
    report.foreign = [b.foreign for b in store.iter_blobs() if b.foreign] if full else []
    return report


def _check_blob(store: BlobStore, digest: str, size: int, full: bool) -> str | None:
    try:
        info = store.stat(digest)
        if info.size != size:
            return "size"
        if full:
            got, n = _hash_blob(store, digest)
            if got != digest or n != size:
                return "digest"
    except BlobNotFound:
        return "missing"
    except StorageError:
        return "unreadable"
    return None


@dataclass
class GcReport:
    scanned: int = 0
    referenced: int = 0
    deleted: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # skipped: not blobs of ours
    kept_young: int = 0
    freed_bytes: int = 0
    aborted_uploads: int = 0


def referenced_digests(session: Session) -> set[str]:
    """Every blob digest the index points at: artifact files (incl. manifests and logs), broken
    artifacts too (their evidence), stored model bundle files, every file of an ORT model
    package (its record too), the files a genai part's twin build compiled, and models' sample
    inputs with their stored CPU references."""
    refs = set(session.scalars(select(ArtifactFile.digest)))
    for files in session.scalars(select(Model.files)):
        refs.update(f["digest"] for f in files if f.get("stored"))
    from registry.models import ModelPackageRow

    for files in session.scalars(select(ModelPackageRow.files)):  # ORT model packages
        refs.update(f["digest"] for f in files)
    from registry.models import TwinBuild

    for output in session.scalars(select(TwinBuild.output).where(TwinBuild.output.is_not(None))):
        refs.update(f["digest"] for f in (output or {}).get("files") or [])  # genai parts' twin builds
    from registry.models import ModelSample

    # A model's sample inputs and the CPU reference kept with them (device agents fetch both).
    for sample, reference in session.execute(select(ModelSample.digest, ModelSample.reference_digest)):
        refs.add(sample)
        if reference:
            refs.add(reference)
    return refs


def gc(session: Session, store: BlobStore, *, grace: timedelta, dry_run: bool = False,
       now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> GcReport:
    """Delete unreferenced blobs older than ``grace``. A publication uploads blobs before it
    inserts its rows, so a young unreferenced blob may be an upload in flight: keep it."""
    report = GcReport()
    refs = referenced_digests(session)
    report.referenced = len(refs)
    cutoff = now() - grace
    for info in store.iter_blobs():
        if info.foreign:
            report.foreign.append(info.foreign)
            continue
        report.scanned += 1
        if info.digest in refs:
            continue
        if info.modified is None or _aware(info.modified) > cutoff:
            report.kept_young += 1
            continue
        if not dry_run:
            # Re-read the blob's age right before deleting: a publisher re-putting the same
            # content refreshes it, and must not lose it to us.
            try:
                fresh = store.stat(info.digest)
            except BlobNotFound:
                continue
            if fresh.modified is not None and _aware(fresh.modified) > cutoff:
                report.kept_young += 1
                continue
            store.delete(info.digest)
        report.deleted.append(info.digest)
        report.freed_bytes += info.size
    abort = getattr(store, "abort_stale_uploads", None)
    if abort is not None and not dry_run:
        report.aborted_uploads = abort(cutoff)
    return report


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def to_dict(report: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(report)
