"""Record and look up models, tags, builds and artifacts in the SQL index.

The UNIQUE build key is the arbiter of dedupe: whoever inserts the row compiles; everyone else
reads it. Build state transitions (guarded, leased) live in ``farm.pipeline.states``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from farm.core.errors import BadNameError, NotFoundError, TagConflictError, UsageError
from farm.core.keys import is_digest
from farm.core.names import split_ref
from farm.core.settings import Settings
from farm.core.times import iso
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


def now() -> datetime:
    return datetime.now(UTC)


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
    _release_blob_puts(session, [str(f["digest"]) for f in files if f.get("digest")])
    return model


def _release_blob_puts(session: Session, digests: list[str]) -> None:
    """These blobs are a recorded model's now, however it came (an upload, an upload session, blobs,
    a genai package or one of its parts): no token's FARM_QUOTA_UPLOAD_MB counts them any longer."""
    from sqlalchemy import delete

    from registry.models import BlobPut

    if digests:
        session.execute(delete(BlobPut).where(BlobPut.digest.in_(sorted(set(digests)))))


def find_model_by_onnx(session: Session, onnx_digest: str) -> list[Model]:
    return list(session.scalars(select(Model).where(Model.onnx_digest == onnx_digest)))


@dataclass(frozen=True)
class TagMove:
    """What ``set_tag`` did: ``previous`` is None for a new tag, the old digest for a move, and
    equal to ``digest`` when the tag already pointed there (nothing written)."""

    name: str
    tag: str
    digest: str
    previous: str | None

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"

    @property
    def moved(self) -> bool:
        return self.previous is not None and self.previous != self.digest

    @property
    def changed(self) -> bool:
        return self.previous != self.digest

    def as_move(self) -> dict[str, str] | None:
        """``{"tag": NAME:TAG, "from": old digest, "to": new digest}`` if the tag moved, else None."""
        if not self.moved:
            return None
        assert self.previous is not None
        return {"tag": self.ref, "from": self.previous, "to": self.digest}

    def describe(self) -> str:
        if self.moved:
            return f"moved {self.ref}: {self.previous} -> {self.digest}"
        if self.previous is None:
            return f"tagged {self.ref} -> {self.digest}"
        return f"{self.ref} already points at {self.digest}"


def set_tag(session: Session, name: str, tag: str, digest: str, *, force: bool = False,
            promoting: bool = False) -> TagMove:
    """Point NAME:TAG at a model digest (history recorded when it changes). Moving an existing
    tag to another digest needs ``force``: devices resolve by tag, so a move changes what they
    load. Raises TagConflictError otherwise, having written nothing. A tag ``farm promote`` moved
    moves only by promote (``promoting``) until ``farm tag --ungate`` (TagGatedError)."""
    row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == tag))
    if row is not None and row.model_digest == digest:
        return TagMove(name, tag, digest, digest)
    if row is not None and not promoting:
        from registry.gates import check_not_gated

        check_not_gated(session, name, tag)
    if row is not None and not force:
        raise TagConflictError(
            f"{name}:{tag} points at model {row.model_digest}; not moving it to {digest}",
            hint=f"to move it on purpose: add --force-tag (farm build, farm submit), or farm tag --force "
                 f"{name}:{tag} {digest[:19]}",
            details={"tag": f"{name}:{tag}", "current": row.model_digest, "requested": digest})
    previous = row.model_digest if row else None
    if row is None:
        session.add(Tag(name=name, tag=tag, model_digest=digest))
    else:
        row.model_digest = digest
        row.updated_at = now()
    session.add(TagEvent(name=name, tag=tag, model_digest=digest, previous_digest=previous))
    session.flush()
    return TagMove(name, tag, digest, previous)


def delete_tag(session: Session, name: str, tag: str) -> str:
    """Remove NAME:TAG; returns the digest it pointed at. The history keeps a deletion event
    (``previous_digest`` equal to ``model_digest``: set_tag never records that)."""
    row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == tag))
    if row is None:
        raise NotFoundError(f"no tag {name}:{tag}", hint=_tags_hint(session, name))
    from registry.gates import check_not_gated

    check_not_gated(session, name, tag)
    digest = row.model_digest
    session.add(TagEvent(name=name, tag=tag, model_digest=digest, previous_digest=digest))
    session.delete(row)
    session.flush()
    return digest


def tag_history(session: Session, name: str, tag: str) -> list[dict[str, Any]]:
    """Every change of NAME:TAG, oldest first: action (created | moved | deleted), the digest it
    pointed at after it (before it, for a deletion), the previous one, and when (ISO 8601 UTC)."""
    out = []
    for e in session.scalars(select(TagEvent).where(TagEvent.name == name, TagEvent.tag == tag)
                             .order_by(TagEvent.id)):
        if e.previous_digest is None:
            action = "created"
        elif e.previous_digest == e.model_digest:
            action = "deleted"
        else:
            action = "moved"
        out.append({"action": action, "digest": e.model_digest,
                    "previous": e.previous_digest if action == "moved" else None, "at": iso(e.at)})
    return out


def tag_view(session: Session, name: str, tag: str) -> dict[str, Any]:
    """NAME:TAG now (``digest`` None once deleted) and its history; not-found if it never existed."""
    row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == tag))
    history = tag_history(session, name, tag)
    if row is None and not history:
        raise NotFoundError(f"no tag {name}:{tag}", hint=_tags_hint(session, name))
    return {"ref": f"{name}:{tag}", "name": name, "tag": tag, "digest": row.model_digest if row else None,
            "updated_at": iso(row.updated_at) if row else None, "history": history}


def tag_source(session: Session, ref: str) -> tuple[str, str | None]:
    """What ``farm tag NAME:TAG SOURCE`` points the tag at: (model digest, the artifact digest
    when SOURCE named an artifact). SOURCE is an artifact id (its model), a model digest or
    unique prefix, or a model ref (NAME:TAG, NAME)."""
    if _hex_prefix(ref):
        hexpart = ref.removeprefix("sha256:")
        models = list(session.scalars(select(Model.digest).where(Model.digest.like(f"sha256:{hexpart}%")).limit(2)))
        arts = list(session.execute(select(Artifact.digest, Artifact.model_digest)
                                    .where(Artifact.digest.like(f"sha256:{hexpart}%")).limit(2)))
        if len(models) + len(arts) > 1:
            raise NotFoundError(f"{ref!r} is ambiguous: it starts more than one model or artifact digest",
                                hint="give more digits")
        if models:
            return models[0], None
        if arts:
            return arts[0][1], arts[0][0]
    return resolve_model_ref(session, ref), None


def resolve_model_ref(session: Session, ref: str) -> str:
    """NAME:TAG, NAME (= NAME:latest), a full digest or a unique hex prefix -> model digest."""
    if is_digest(ref):
        if session.get(Model, ref) is None:
            raise NotFoundError(f"no model {ref} in the registry")
        return ref
    if ref.startswith("sha256:") and not _hex_prefix(ref):
        # A malformed digest is a bad argument (exit 2), not a model that is missing.
        raise UsageError(f"{ref[:80]!r} is not a model digest",
                         hint="sha256: then 6 to 64 lowercase hex digits (or NAME:TAG)")
    name = None
    if not ref.startswith("sha256:"):
        try:
            name, tag = split_ref(ref)
        except BadNameError:
            if not _hex_prefix(ref):
                raise
        else:
            row = session.scalar(select(Tag).where(Tag.name == name, Tag.tag == tag))
            if row is not None:
                return row.model_digest
    prefix = ref.removeprefix("sha256:")
    if len(prefix) >= 6 and all(c in "0123456789abcdef" for c in prefix):
        hits = list(session.scalars(select(Model.digest).where(Model.digest.like(f"sha256:{prefix}%")).limit(2)))
        if len(hits) == 1:
            return hits[0]
    if name is not None and ":" not in ref and _name_tags(session, name):
        raise NotFoundError(f"{name} has no tag latest (a bare name means {name}:latest here)",
                            hint=_tags_hint(session, name))
    raise NotFoundError(f"no model {ref!r} in the registry", hint=_tags_hint(session, name))


def resolve_model_refs(session: Session, ref: str) -> list[str]:
    """For listings (ls, coverage): a bare NAME is every model one of its tags points at;
    NAME:TAG, a digest or a unique prefix is that one model."""
    if ":" not in ref and not _hex_prefix(ref):
        from farm.core.names import check_name

        check_name(ref)
        digests = sorted({d for (d,) in session.execute(select(Tag.model_digest).where(Tag.name == ref))})
        if digests:
            return digests
    return [resolve_model_ref(session, ref)]


def _name_tags(session: Session, name: str) -> list[str]:
    return [f"{name}:{t}" for t in session.scalars(select(Tag.tag).where(Tag.name == name).order_by(Tag.tag).limit(20))]


def _tags_hint(session: Session, name: str | None) -> str:
    if name is not None and (own := _name_tags(session, name)):
        return "its tags: " + ", ".join(own)
    tags = [f"{n}:{t}" for n, t in session.execute(select(Tag.name, Tag.tag).order_by(Tag.name, Tag.tag).limit(20))]
    return ("known tags: " + ", ".join(tags)) if tags else "build one first: farm build MODEL.onnx --name NAME"


def _hex_prefix(ref: str) -> bool:
    p = ref.removeprefix("sha256:")
    return 6 <= len(p) <= 64 and all(c in "0123456789abcdef" for c in p)


def tags_of(session: Session, digest: str) -> list[str]:
    return [f"{n}:{t}" for n, t in session.execute(
        select(Tag.name, Tag.tag).where(Tag.model_digest == digest).order_by(Tag.name, Tag.tag))]


def tags_by_digest(session: Session, digests: list[str]) -> dict[str, list[str]]:
    """model digest -> its NAME:TAGs (sorted), in one query."""
    out: dict[str, list[str]] = {d: [] for d in digests}
    if digests:
        for d, n, t in session.execute(select(Tag.model_digest, Tag.name, Tag.tag)
                                       .where(Tag.model_digest.in_(set(digests))).order_by(Tag.name, Tag.tag)):
            out[d].append(f"{n}:{t}")
    return out


# ---- builds (state transitions live in farm.pipeline.states) ----------------------------------------

def get_build(session: Session, build_id: int) -> Build:
    row = session.get(Build, build_id)
    if row is None:
        raise NotFoundError(f"no build {build_id}")
    return row


# ---- artifacts ----------------------------------------------------------------------------------

def insert_artifact(session: Session, build_id: int, *, manifest_digest: str, manifest_size: int,
                    ctx_model: str, files: list[dict[str, Any]], ep_sdk_version: str | None,
                    compile_seconds: float, nodes_ep: int, nodes_cpu: int,
                    description: dict[str, Any] | None = None, cpu_op_types: list[str] | None = None,
                    compatibility: dict[str, str] | None = None) -> Artifact:
    """Insert the artifact of a build, in the caller's transaction (which also moves the build
    to succeeded, guarded). A previous artifact of the build that was marked broken is replaced:
    its rows go, its blobs stay for gc. Call only after every blob is in the store. The targets
    it serves (``artifact_targets``): its own, or each SoC of a multi-SoC target (``A+B``).
    ``cpu_op_types``: the op types left on the CPU (the manifest's placement); ``compatibility``:
    the EP's own compatibility string by EP name (the manifest's)."""
    from registry.models import ArtifactTarget

    build = get_build(session, build_id)
    old = session.scalar(select(Artifact).where(Artifact.build_id == build_id))
    if old is not None:
        session.delete(old)
        session.flush()
    artifact = Artifact(
        digest=manifest_digest, build_id=build.id, model_digest=build.model_digest, backend=build.backend,
        target=build.target, toolchain=build.toolchain, options_digest=build.options_digest,
        ctx_model=ctx_model, ep_sdk_version=ep_sdk_version, compile_seconds=compile_seconds,
        size=sum(int(f["size"]) for f in files if f["role"] in ("ctx-model", "context")),
        nodes_ep=nodes_ep, nodes_cpu=nodes_cpu, description=description,
        cpu_op_types=list(cpu_op_types) if cpu_op_types is not None else None,
        compatibility=dict(compatibility) if compatibility is not None else None,
    )
    artifact.files = [ArtifactFile(name=f["name"], role=f["role"], digest=f["digest"], size=f["size"],
                                   media_type=f["mediaType"]) for f in files]
    artifact.files.append(ArtifactFile(name="manifest.json", role="manifest", digest=manifest_digest,
                                       size=manifest_size, media_type="application/vnd.ctxfarm.manifest.v1+json"))
    session.add(artifact)
    session.flush()
    covered = build.target.split("+") if build.backend == "qnn" else [build.target]
    session.add_all([ArtifactTarget(artifact_id=artifact.id, target=t) for t in dict.fromkeys(covered)])
    return artifact


def artifact_for_build(session: Session, build_id: int) -> Artifact | None:
    return session.scalar(select(Artifact).options(selectinload(Artifact.files)).where(Artifact.build_id == build_id))


def find_artifact(session: Session, ref: str) -> Artifact:
    """An artifact by manifest digest, or by a unique prefix of its hex (>= 6 chars)."""
    hexpart = ref.removeprefix("sha256:").lower()
    if len(hexpart) < 6 or any(c not in "0123456789abcdef" for c in hexpart):
        raise UsageError(f"{ref[:80]!r} is not an artifact id", hint="use the id `farm ls` prints (6+ hex digits)")
    hits = list(session.scalars(
        select(Artifact).options(selectinload(Artifact.files), selectinload(Artifact.build))
        .where(Artifact.digest.like(f"sha256:{hexpart}%")).limit(2)))
    if not hits:
        raise NotFoundError(f"no artifact {ref!r}", hint="`farm ls` lists the artifacts")
    if len(hits) > 1:
        raise NotFoundError(f"artifact id {ref!r} is ambiguous", hint="give more digits")
    return hits[0]


def list_artifacts(session: Session, *, model_digest: str | list[str] | None = None, backend: str | None = None,
                   target: str | None = None, limit: int = 200) -> list[Artifact]:
    """Newest first; each with its build's options loaded (ls shows the non-default ones)."""
    q = (select(Artifact).options(selectinload(Artifact.build).load_only(Build.options))
         .order_by(Artifact.created_at.desc(), Artifact.id.desc()).limit(limit))
    if isinstance(model_digest, list):
        q = q.where(Artifact.model_digest.in_(model_digest))
    elif model_digest:
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


def verdicts_of(session: Session, artifact_id: int) -> list[Any]:
    """Every piece of compatibility evidence recorded for one artifact, by runtime version."""
    from farm.core.keys import parse_version
    from registry.models import CompatVerdict

    rows = list(session.scalars(select(CompatVerdict).where(CompatVerdict.artifact_id == artifact_id)))
    return sorted(rows, key=lambda r: (r.runtime_backend, parse_version(r.runtime_version), r.source))


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


def release_builds(session: Session, release_id: int) -> list[Build]:
    from registry.models import ReleaseBuild

    return list(session.scalars(select(Build).join(ReleaseBuild, ReleaseBuild.build_id == Build.id)
                                .where(ReleaseBuild.release_id == release_id).order_by(Build.target, Build.toolchain)))


def genai_roles(session: Session, build_ids: Sequence[int]) -> dict[int, str]:
    """What each of these builds is in a genai package's release: ``package``, or the part it
    builds (``part0``, ``part1``, ...); builds of no package are left out. Status tables show
    it: a release's builds otherwise differ only by their ids."""
    from registry.models import GenaiPart

    ids = [int(b) for b in build_ids]
    if not ids:
        return {}
    out: dict[int, str] = {}
    links = select(GenaiPart.package_build_id, GenaiPart.part, GenaiPart.part_build_id).where(
        or_(GenaiPart.package_build_id.in_(ids), GenaiPart.part_build_id.in_(ids)))
    for pkg, part, part_build in session.execute(links):
        if pkg in ids:
            out[int(pkg)] = "package"
        if part_build in ids:
            out.setdefault(int(part_build), f"part{int(part)}")
    return out
