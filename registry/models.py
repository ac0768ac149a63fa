"""Index tables. Constraints live here (UNIQUE build key, CHECKs on digests and states)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from registry.db import Base

BUILD_STATES = ("queued", "running", "succeeded", "failed")
ARTIFACT_STATUSES = ("active", "broken")
DIGEST_LEN = 71  # "sha256:" + 64 hex


def utcnow() -> datetime:
    return datetime.now(UTC)


def _digest_check(column: str) -> CheckConstraint:
    return CheckConstraint(f"{column} LIKE 'sha256:%' AND length({column}) = {DIGEST_LEN}", name=f"{column}_shape")


class Model(Base):
    """A model bundle, known by its digest."""

    __tablename__ = "models"
    # (first_name, digest): the coverage drill-down pages models by name (migration 0008).
    __table_args__ = (_digest_check("digest"), Index(None, "first_name", "digest"))

    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), primary_key=True)
    onnx_digest: Mapped[str] = mapped_column(String(DIGEST_LEN), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    first_name: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Tag(Base):
    """NAME:TAG -> model digest. Tags move; digests never change."""

    __tablename__ = "tags"
    __table_args__ = (UniqueConstraint("name", "tag"), Index(None, "model_digest"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    tag: Mapped[str] = mapped_column(String(128))
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TagEvent(Base):
    """History of tag moves (append-only)."""

    __tablename__ = "tag_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    tag: Mapped[str] = mapped_column(String(128))
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    previous_digest: Mapped[str | None] = mapped_column(String(DIGEST_LEN))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BuildColumns:
    """The columns of a compile job, shared by ``builds`` and ``twin_builds``: the key, what it
    compiles, its state and lease (the guarded transitions of ``farm.pipeline.states`` move either
    table), its queue and timings."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    build_key: Mapped[str] = mapped_column(String(64))
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    backend: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[str] = mapped_column(String(64))
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    options_digest: Mapped[str] = mapped_column(String(DIGEST_LEN))
    state: Mapped[str] = mapped_column(String(16), default="queued")
    error_code: Mapped[str | None] = mapped_column(String(32))
    error_message: Mapped[str | None] = mapped_column(Text)
    log: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    queue: Mapped[str | None] = mapped_column(String(128))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker: Mapped[str | None] = mapped_column(String(255))
    # Where the last attempt's time went, in ms (farm.pipeline.execute.Phases): claim, bundle
    # fetch, compile child, uploads, SQL; shown by `farm status --build` and bench/farm.py.
    phases: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Build(BuildColumns, Base):
    """One (model, backend, target, toolchain, options) compile. The build key is the arbiter."""

    __tablename__ = "builds"
    __table_args__ = (
        UniqueConstraint("build_key"),
        CheckConstraint("length(build_key) = 64", name="build_key_shape"),
        CheckConstraint(f"state IN {BUILD_STATES!r}", name="state_known"),
        CheckConstraint("attempts >= 0", name="attempts_nonneg"),
        Index(None, "model_digest", "backend", "target"),
    )

    artifact: Mapped[Artifact | None] = relationship(back_populates="build", uselist=False)


class Artifact(Base):
    """A published build result: a manifest blob plus the files it lists."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("digest"),
        UniqueConstraint("build_id"),
        _digest_check("digest"),
        CheckConstraint(f"status IN {ARTIFACT_STATUSES!r}", name="status_known"),
        Index(None, "model_digest", "backend", "target", "toolchain"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN))  # manifest digest
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"))
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    backend: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[str] = mapped_column(String(64))
    options_digest: Mapped[str] = mapped_column(String(DIGEST_LEN))
    ctx_model: Mapped[str] = mapped_column(String(255))
    ep_sdk_version: Mapped[str | None] = mapped_column(String(64))
    compile_seconds: Mapped[float] = mapped_column(Float)
    size: Mapped[int] = mapped_column(BigInteger)
    nodes_ep: Mapped[int] = mapped_column(Integer)
    nodes_cpu: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default="active")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # What the context binaries say about themselves, read through the QNN System API of the
    # toolchain that built them (graphs, inputs/outputs, SoC, sizes), the check against the
    # requested graphs, and ``unverified`` (why no runtime here can load it) where that applies.
    description: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The op types the build left on the CPU (partial offload; [] when fully offloaded), and the
    # EP's own compatibility string by EP name (``ep_compatibility_info.<EP>`` of the context
    # model): both also in the manifest; NULL for artifacts published before migration 0012.
    cpu_op_types: Mapped[list[str] | None] = mapped_column(JSON)
    compatibility: Mapped[dict[str, str] | None] = mapped_column(JSON)

    build: Mapped[Build] = relationship(back_populates="artifact")
    files: Mapped[list[ArtifactFile]] = relationship(
        back_populates="artifact", order_by="ArtifactFile.name", cascade="all, delete-orphan"
    )

    @property
    def short_id(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]


class ArtifactFile(Base):
    """A file of an artifact, by the relative name the context model expects."""

    __tablename__ = "artifact_files"
    __table_args__ = (UniqueConstraint("artifact_id", "name"), _digest_check("digest"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(32))  # ctx-model | context | log | manifest
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    media_type: Mapped[str] = mapped_column(String(128))

    artifact: Mapped[Artifact] = relationship(back_populates="files")


class ArtifactTarget(Base):
    """A target an artifact serves: its own, or each SoC of a multi-SoC build (SM8650+SM8750).
    Resolve and coverage read this to answer a device of any covered SoC."""

    __tablename__ = "artifact_targets"

    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class Signature(Base):
    """An ed25519 signature over an artifact's manifest digest, attached by subject (like cosign)."""

    __tablename__ = "signatures"
    __table_args__ = (UniqueConstraint("artifact_digest", "key_id"), _digest_check("artifact_digest"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_digest: Mapped[str] = mapped_column(String(DIGEST_LEN), index=True)
    key_id: Mapped[str] = mapped_column(String(32))
    public_key: Mapped[str] = mapped_column(String(64))  # base64 of the raw 32-byte key
    signature: Mapped[str] = mapped_column(String(128))  # base64 of the 64-byte signature
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


VERDICTS = ("loads", "fails")
VERDICT_SOURCES = ("rule", "probe")


class CompatVerdict(Base):
    """Evidence that an artifact loads (or not) under a runtime: measured by a probe, or a rule."""

    __tablename__ = "compat_verdicts"
    __table_args__ = (
        UniqueConstraint("artifact_id", "runtime_backend", "runtime_version", "source", name="uq_compat_verdicts_key"),
        CheckConstraint(f"verdict IN {VERDICTS!r}", name="verdict_known"),
        CheckConstraint(f"source IN {VERDICT_SOURCES!r}", name="source_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), index=True)
    runtime_backend: Mapped[str] = mapped_column(String(16))
    runtime_version: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(8))
    source: Mapped[str] = mapped_column(String(8))
    detail: Mapped[str | None] = mapped_column(Text)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Worker(Base):
    """A farm worker: what it serves and when it was last seen (heartbeat)."""

    __tablename__ = "workers"
    __table_args__ = (UniqueConstraint("name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str] = mapped_column(String(16))
    toolchain: Mapped[str] = mapped_column(String(64))
    ort_version: Mapped[str] = mapped_column(String(32))
    ep_package: Mapped[str] = mapped_column(String(64))
    ep_version: Mapped[str] = mapped_column(String(32))
    queues: Mapped[list[str]] = mapped_column(JSON)
    extra: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)


class Release(Base):
    """A release: one model over a target x toolchain matrix. Fan-in is tracked here, in SQL."""

    __tablename__ = "releases"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    label: Mapped[str | None] = mapped_column(String(255))
    matrix: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The token that submitted it through the service (None: a local `farm submit`): only it or an
    # admin cancels it. A cancelled release no longer wants its builds; a build is cancelled once
    # no release wants it (farm.pipeline.cancel).
    owner_token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    cancelled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ReleaseBuild(Base):
    __tablename__ = "release_builds"

    release_id: Mapped[int] = mapped_column(ForeignKey("releases.id", ondelete="CASCADE"), primary_key=True)
    build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), primary_key=True, index=True)


class GenaiPart(Base):
    """A genai package's build and, per part, the group build it is assembled from
    (farm.pipeline.genai): the cluster's fan-in reads it when a part's build is final."""

    __tablename__ = "genai_parts"

    package_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id", ondelete="CASCADE"), primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True)
    part_build_id: Mapped[int] = mapped_column(ForeignKey("builds.id"), index=True)


class TwinBuild(BuildColumns, Base):
    """A genai part's twin compile (farm.pipeline.genai.twin_builds): the part's prefill and decode
    compiled alone, without weight sharing, with the quickest finalization: what the twin check
    runs on the simulator. A build like any other (keyed, queued, leased, its transitions the
    guarded ones of ``farm.pipeline.states``: the same columns as ``builds``), kept in a table of
    its own so that nothing that serves devices ever sees it: no artifact row, no coverage cell,
    no tag; its output is content-addressed blobs listed in ``output`` (kept by ``registry gc``)."""

    __tablename__ = "twin_builds"
    __table_args__ = (
        UniqueConstraint("build_key"),
        CheckConstraint("length(build_key) = 64", name="build_key_shape"),
        CheckConstraint(f"state IN {BUILD_STATES!r}", name="state_known"),
        CheckConstraint("attempts >= 0", name="attempts_nonneg"),
        Index(None, "state", "queue"),
    )

    # What it compiled: each file (name, role, digest, size, mediaType) and each graph's context
    # model by its group name (``part0.prefill``), with the compile's figures; None until it succeeded.
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON)


# ``report``: devices posting load reports; outside the read < submit < admin ladder.
TOKEN_SCOPES = ("read", "submit", "admin", "report")


class ApiToken(Base):
    """A bearer token of the HTTP service, stored as its sha256 only (shown once at creation)."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        UniqueConstraint("name"),
        UniqueConstraint("token_hash"),
        CheckConstraint(f"scope IN {TOKEN_SCOPES!r}", name="scope_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TokenRevocations(Base):
    """One row: a version that every token revocation bumps in its own transaction. A service
    process trusts a token it cached only while the version it read with it is unchanged, so a
    revoked token is refused by every process from the moment the revocation commits."""

    __tablename__ = "token_revocations"
    __table_args__ = (CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    version: Mapped[int] = mapped_column(BigInteger, default=0)


class UploadSession(Base):
    """A resumable upload (``POST /v1/uploads``): owned by the token that opened it, its bytes
    counted against that token's quota; untouched for FARM_UPLOAD_TTL_S it expires. The bytes
    themselves are in ``FARM_HOME/uploads/session-ID`` (the id is the server's random hex)."""

    __tablename__ = "upload_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    size: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    touched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BlobPut(Base):
    """A blob a token stored with ``PUT /v1/blobs/DIGEST`` that nothing references yet: removed
    when a model that holds it is recorded, however it came (a genai package and its parts too:
    ``registry.index._release_blob_puts``);
    counted against the token's ``FARM_QUOTA_UPLOAD_MB`` with its upload sessions for
    ``FARM_UPLOAD_TTL_S``."""

    __tablename__ = "blob_puts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN), index=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


ACCURACY_STATUSES = ("ok", "runtime-crashed", "skipped", "unverified")


class AccuracyResult(Base):
    """Numerical evidence: an artifact run under a runtime (the HTP simulator) against
    the source model on onnxruntime's CPU EP, same inputs; per output PSNR, cosine, max abs error.
    ``inputs`` names the inputs (``seeded:0`` or an uploaded sample's digest); ``numerics_key``
    lets another artifact with the same model, context bytes, runtime and inputs reuse a row."""

    __tablename__ = "accuracy_results"
    __table_args__ = (
        UniqueConstraint("artifact_id", "runtime_backend", "runtime_version", "inputs", name="uq_accuracy_results_key"),
        CheckConstraint(f"status IN {ACCURACY_STATUSES!r}", name="status_known"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"), index=True)
    runtime_backend: Mapped[str] = mapped_column(String(16))
    runtime_version: Mapped[str] = mapped_column(String(64))
    inputs: Mapped[str] = mapped_column(String(80))
    numerics_key: Mapped[str] = mapped_column(String(64), index=True)
    status: Mapped[str] = mapped_column(String(16))
    outputs: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    min_psnr_db: Mapped[float | None] = mapped_column(Float)
    worst_output: Mapped[str | None] = mapped_column(String(255))
    detail: Mapped[str | None] = mapped_column(Text)
    run_seconds: Mapped[float | None] = mapped_column(Float)
    reference_seconds: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ModelSample(Base):
    """A submitter's sample inputs for a model (an ``.npz`` blob, validated against the model's
    inputs on upload): what accuracy runs feed instead of seeded inputs."""

    __tablename__ = "model_samples"
    __table_args__ = (_digest_check("digest"), _digest_check("reference_digest"))

    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN))
    size: Mapped[int] = mapped_column(BigInteger)
    inputs: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The source model's outputs on onnxruntime's CPU EP for these samples (an ``.npz`` blob made by
    # the accuracy check), handed to device agents as their reference; None with ``reference_why``
    # saying why none is kept (over FARM_REFERENCE_MAX_BYTES). Cleared when the samples change.
    reference_digest: Mapped[str | None] = mapped_column(String(DIGEST_LEN))
    reference_size: Mapped[int | None] = mapped_column(BigInteger)
    reference_why: Mapped[str | None] = mapped_column(String(300))


REPORT_OUTCOMES = ("loads", "fails", "crashed")


class DeviceReport(Base):
    """What a device saw when it loaded an artifact (``POST /v1/reports``). One row per (artifact,
    token, device, runtime): a device reporting again replaces its row (``count`` goes up), so
    one device never outvotes the fleet. ``revoked_at``: struck (``revoked_why`` says by what)."""

    __tablename__ = "device_reports"
    __table_args__ = (
        UniqueConstraint("artifact_id", "token_id", "device_id", "runtime_backend", "runtime_version",
                         name="uq_device_reports_key"),
        CheckConstraint(f"outcome IN {REPORT_OUTCOMES!r}", name="outcome_known"),
        Index(None, "artifact_id", "runtime_backend", "runtime_version"),
        # The evidence group (artifact, runtime, SoC) by token: "another token reported here" is two
        # index seeks (registry.coverage_sql; migration 0010).
        Index("ix_device_reports_group_token", "artifact_id", "runtime_backend", "runtime_version", "soc", "token_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id", ondelete="CASCADE"))
    token_id: Mapped[int] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    device_id: Mapped[str] = mapped_column(String(128))
    device_model: Mapped[str] = mapped_column(String(128))
    soc: Mapped[str] = mapped_column(String(64))
    os: Mapped[str] = mapped_column(String(128))
    # The runtime's CPU architecture (migration 0010): rows without one predate it and
    # never count as device evidence.
    arch: Mapped[str | None] = mapped_column(String(16))
    runtime_backend: Mapped[str] = mapped_column(String(16))
    runtime_version: Mapped[str] = mapped_column(String(64))
    ort_version: Mapped[str] = mapped_column(String(32))
    ep_package: Mapped[str | None] = mapped_column(String(64))
    ep_version: Mapped[str | None] = mapped_column(String(32))
    driver: Mapped[str | None] = mapped_column(String(128))
    outcome: Mapped[str] = mapped_column(String(8))
    error: Mapped[str | None] = mapped_column(Text)
    load_ms: Mapped[float | None] = mapped_column(Float)
    first_inference_ms: Mapped[float | None] = mapped_column(Float)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float)
    fingerprint: Mapped[str | None] = mapped_column(String(128))
    psnr_db: Mapped[float | None] = mapped_column(Float)
    count: Mapped[int] = mapped_column(Integer, default=1)
    reported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Why it was struck: revoked by an admin, token revoked, quarantine lifted (migration 0010).
    revoked_why: Mapped[str | None] = mapped_column(String(64))


class CoverageCell(Base):
    """A (model, backend, target, toolchain) cell that has builds: their counts and the cell's
    state. Kept by triggers (registry.coverage_sql, migration 0008); never written by the code."""

    __tablename__ = "coverage_cells"
    __table_args__ = (Index(None, "backend", "target", "toolchain", "state"),)

    model_digest: Mapped[str] = mapped_column(String(DIGEST_LEN), primary_key=True)
    backend: Mapped[str] = mapped_column(String(16), primary_key=True)
    target: Mapped[str] = mapped_column(String(64), primary_key=True)
    toolchain: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))  # built | building | broken | failed
    builds: Mapped[int] = mapped_column(Integer)
    succeeded: Mapped[int] = mapped_column(Integer)
    building: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    broken: Mapped[int] = mapped_column(Integer)
    probe_verified: Mapped[int] = mapped_column(Integer)
    device_verified: Mapped[int] = mapped_column(Integer)


class CoverageDelta(Base):
    """Append-only changes of the coverage summary per (backend, target, toolchain): the summary
    is their sum (registry.coverage.summary), folded now and then (registry.coverage.compact)."""

    __tablename__ = "coverage_deltas"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope: Mapped[str] = mapped_column(String(140))  # '' the whole farm, tag:TAG the models with a NAME:TAG
    backend: Mapped[str] = mapped_column(String(16))
    target: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[str] = mapped_column(String(64))
    cells: Mapped[int] = mapped_column(Integer)
    built: Mapped[int] = mapped_column(Integer)
    building: Mapped[int] = mapped_column(Integer)
    broken: Mapped[int] = mapped_column(Integer)
    failed: Mapped[int] = mapped_column(Integer)
    probe_verified: Mapped[int] = mapped_column(Integer)
    device_verified: Mapped[int] = mapped_column(Integer)
    wanted: Mapped[int] = mapped_column(Integer)


class ModelGeneration(Base):
    """Bumped (by trigger) whenever what resolve reads of a model changes: its artifacts, their
    probe verdicts, device reports and signatures. The service's cached resolve answers are
    keyed by it. Rows are never deleted, so a generation never comes back."""

    __tablename__ = "model_generations"

    model_digest: Mapped[str] = mapped_column(String(DIGEST_LEN), primary_key=True)
    generation: Mapped[int] = mapped_column(BigInteger)


class ModelPackageRow(Base):
    """An ORT model package (``farm.core.packages``): made from a model's published
    builds, verified, its files in the store. ``digest`` is its record's (a blob); ``inputs`` what
    it was made from (model, NAME:TAG, every artifact digest): UNIQUE, so the same inputs are
    answered from the index and a new build makes a new package."""

    __tablename__ = "model_packages"
    __table_args__ = (UniqueConstraint("digest"), UniqueConstraint("inputs"), _digest_check("digest"),
                      Index(None, "model_digest"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(DIGEST_LEN))
    inputs: Mapped[str] = mapped_column(String(64))
    model_digest: Mapped[str] = mapped_column(ForeignKey("models.digest"))
    ref: Mapped[str] = mapped_column(String(400))
    size: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


DEVICE_JOB_STATES = ("queued", "leased", "done")
VERIFY_OUTCOMES = ("ok", "fails", "crashed")


class Device(Base):
    """An enrolled device agent (``farm device enroll NAME``): the single-use enrollment token's hash
    until it is used, then the agent's Ed25519 public key and what it said it is. The service
    trusts nothing about a device beyond this row; revoking it strikes its verifications."""

    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("name"), UniqueConstraint("enroll_hash"), UniqueConstraint("key_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    enroll_hash: Mapped[str] = mapped_column(String(64))
    enroll_expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    enrolled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    public_key: Mapped[str | None] = mapped_column(String(64))
    key_id: Mapped[str | None] = mapped_column(String(16))
    # The agent's bearer token (scope read: it installs artifacts like any device), made at enrollment;
    # indexed: every lease, renewal and report finds its device by it.
    token_id: Mapped[int | None] = mapped_column(ForeignKey("api_tokens.id"), index=True)
    soc: Mapped[str | None] = mapped_column(String(64))  # a catalog SoC, or "simulator"
    simulator: Mapped[bool] = mapped_column(default=False)
    facts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # arch, os, runtime, ep versions
    created_by: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class VerificationJob(Base):
    """Run artifact X on a device of SoC Y and report: leased to one agent at a time (``lease_until``),
    a fresh ``nonce`` per lease; the first accepted report makes it ``done`` for good."""

    __tablename__ = "verification_jobs"
    # ix_verification_jobs_open: the open jobs in id order, what a lease walks (registry.verification
    # .lease); done jobs, the lab's history, are never read by it. device_id: a device's jobs.
    __table_args__ = (CheckConstraint(f"state IN {DEVICE_JOB_STATES!r}", name="state_known"),
                      UniqueConstraint("artifact_id", "soc", "slot"), Index(None, "state", "soc"),
                      Index("ix_verification_jobs_open", "id", postgresql_where=text("state <> 'done'"),
                            sqlite_where=text("state <> 'done'")),
                      Index(None, "device_id"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"), index=True)
    soc: Mapped[str] = mapped_column(String(64))
    slot: Mapped[int] = mapped_column(Integer, default=1)  # jobs 1..N of one cell: N distinct devices
    state: Mapped[str] = mapped_column(String(16), default="queued")
    device_id: Mapped[int | None] = mapped_column(ForeignKey("devices.id"))
    nonce: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class DeviceVerification(Base):
    """A verification report, signed by its device's enrolled key over its canonical body (job id
    and the lease's nonce included): one per job (``UNIQUE job_id``), one per nonce."""

    __tablename__ = "device_verifications"
    __table_args__ = (UniqueConstraint("job_id"), UniqueConstraint("nonce"),
                      CheckConstraint(f"outcome IN {VERIFY_OUTCOMES!r}", name="outcome_known"),
                      Index(None, "artifact_id", "soc"))

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("verification_jobs.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    artifact_id: Mapped[int] = mapped_column(ForeignKey("artifacts.id"))
    soc: Mapped[str] = mapped_column(String(64))
    simulator: Mapped[bool] = mapped_column(default=False)
    nonce: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))
    psnr_db: Mapped[float | None] = mapped_column(Float)
    load_ms: Mapped[float | None] = mapped_column(Float)
    first_inference_ms: Mapped[float | None] = mapped_column(Float)
    p50_ms: Mapped[float | None] = mapped_column(Float)
    peak_memory_mb: Mapped[float | None] = mapped_column(Float)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    signature: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    struck_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    struck_why: Mapped[str | None] = mapped_column(String(64))


class Promotion(Base):
    """``farm promote NAME:FROM --to TO``: the tag moved on this evidence (append-only; a rollback is
    a promotion row too, ``kind`` rollback, and so is ``farm tag --ungate``, ``kind`` ungate). While
    a tag's newest promotion gates it, plain ``farm tag --force`` refuses to move it (``tag_gates``)."""

    __tablename__ = "promotions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    tag: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16), default="promote")
    source: Mapped[str | None] = mapped_column(String(128))  # the FROM tag
    model_digest: Mapped[str] = mapped_column(String(DIGEST_LEN))
    previous_digest: Mapped[str | None] = mapped_column(String(DIGEST_LEN))
    require: Mapped[str | None] = mapped_column(String(500))
    allow_simulator: Mapped[bool] = mapped_column(default=False)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    by: Mapped[str | None] = mapped_column(String(255))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class TagGate(Base):
    """NAME:TAG moves only by promote or rollback until ``farm tag --ungate`` removes this row."""

    __tablename__ = "tag_gates"
    __table_args__ = (UniqueConstraint("name", "tag"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    tag: Mapped[str] = mapped_column(String(128))
    promotion_id: Mapped[int] = mapped_column(ForeignKey("promotions.id"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
