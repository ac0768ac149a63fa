"""The index's hot reads in plain SQL: resolve's candidates and the winner's files, a model by
reference, a model by its .onnx bytes, builds by key.

Each runs on any ``registry.lite.Rows``: the service's SQLAlchemy session (``SessionRows``) or
the bare connection the CLI opens without importing SQLAlchemy (``registry.lite.open_index``).
Rows come back as small frozen records, not ORM objects: no identity map, no lazy loads, one
round trip per read. Column names here are the ones in ``registry.models`` (a unit test runs
every read against a schema made by the migrations).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from farm.core.errors import BadNameError
from farm.core.keys import is_digest
from farm.core.names import split_ref
from registry.lite import Rows, as_datetime, as_json, in_params


@dataclass(frozen=True)
class FileRow:
    """A file of an artifact (``artifact_files``)."""

    name: str
    role: str  # ctx-model | context | log | manifest
    digest: str
    size: int
    media_type: str


@dataclass(frozen=True)
class BuildRef:
    """What resolve's rules read of an artifact's build: its normalized options."""

    options: dict[str, Any]


@dataclass(frozen=True)
class Probe:
    """A probe's verdict for one artifact under one runtime version (``compat_verdicts``)."""

    verdict: str  # loads | fails
    detail: str | None
    recorded_at: datetime | None


@dataclass
class Candidate:
    """An active artifact as resolve ranks it; ``files`` are read for the winner only."""

    id: int
    digest: str
    model_digest: str
    backend: str
    target: str
    toolchain: str
    options_digest: str
    ctx_model: str
    created_at: datetime | None
    build: BuildRef
    probe: Probe | None = None
    status: str = "active"
    nodes_ep: int | None = None
    nodes_cpu: int | None = None
    cpu_op_types: list[str] | None = None  # None: published before they were recorded (migration 0012)
    compatibility: dict[str, str] | None = None  # EP name -> the EP's own compatibility string
    files: list[FileRow] = field(default_factory=list)
    signatures: list[tuple[str, str]] = field(default_factory=list)  # (public key, signature), oldest first
    description: dict[str, Any] | None = None  # read for a winner that carries figures (a genai package's twin)
    reported: bool = True  # whether any device report names it (True where unknown: read them)
    total: int | None = None  # the model's active artifacts of this backend, all targets (read with a target)
    lab_reported: bool = False  # whether any device lab report (``device_verifications``) names it
    lab: list[dict[str, Any]] | None = None  # a winner's: what enrolled devices confirmed (registry.lab)
    preferred: dict[str, Any] | None = None  # a winner picked for its measured speed (FARM_RESOLVE_PREFER_FASTEST)

    @property
    def short_id(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]


def candidates(rows: Rows, model_digest: str, backend: str, runtime: str, target: str | None = None
               ) -> list[Candidate]:
    """Active artifacts of a model for a backend (one target's only, when given), each with its
    build's options and the probe verdict recorded for exactly ``runtime``, in one statement
    (indexes: artifacts (model_digest, backend, target, toolchain), compat_verdicts
    (artifact_id); the UNIQUE verdict key makes the outer join one row per artifact)."""
    # ``reported``: whether any device report names the artifact (an index probe each), so resolve
    # reads the device evidence only where there is some; ``lab_reported`` the same for the device
    # lab's reports (index on device_verifications (artifact_id, soc)). With a target: ``total``, the model's
    # active artifacts of the backend on every target, so a miss with enough of this target's to
    # name as nearest is explained without reading the others (``registry.resolve``).
    total = ("(SELECT count(*) FROM artifacts c WHERE c.model_digest = :model AND c.backend = :backend"
             " AND c.status = :active)" if target is not None else "NULL")
    sql = ("SELECT a.id, a.digest, a.target, a.toolchain, a.options_digest, a.ctx_model, a.created_at, b.options,"
           " v.verdict, v.detail, v.recorded_at, a.nodes_ep, a.nodes_cpu, a.cpu_op_types, a.compatibility,"
           f" EXISTS (SELECT 1 FROM device_reports r WHERE r.artifact_id = a.id), {total},"
           " EXISTS (SELECT 1 FROM device_verifications dv WHERE dv.artifact_id = a.id)"
           " FROM artifacts a JOIN builds b ON b.id = a.build_id"
           " LEFT JOIN compat_verdicts v ON v.artifact_id = a.id AND v.runtime_backend = :backend"
           " AND v.runtime_version = :runtime AND v.source = :probe"
           " WHERE a.model_digest = :model AND a.backend = :backend AND a.status = :active")
    params: dict[str, Any] = {"model": model_digest, "backend": backend, "runtime": runtime, "probe": "probe",
                              "active": "active"}
    if target is not None:
        # A multi-SoC artifact (SM8650+SM8750) serves each SoC it lists in artifact_targets.
        sql += (" AND (a.target = :target OR a.id IN"
                " (SELECT t.artifact_id FROM artifact_targets t WHERE t.target = :target))")
        params["target"] = target
    sql += " ORDER BY a.id"  # the same order whichever plan: ties in the ranking fall the same way
    return [Candidate(id=r[0], digest=r[1], model_digest=model_digest, backend=backend, target=r[2],
                      toolchain=r[3], options_digest=r[4], ctx_model=r[5], created_at=as_datetime(r[6]),
                      build=BuildRef(as_json(r[7]) or {}),
                      probe=Probe(r[8], r[9], as_datetime(r[10])) if r[8] is not None else None,
                      nodes_ep=r[11], nodes_cpu=r[12], cpu_op_types=as_json(r[13]), compatibility=as_json(r[14]),
                      reported=bool(r[15]), total=None if r[16] is None else int(r[16]), lab_reported=bool(r[17]))
            for r in rows.rows(sql, params)]


def artifact_description(rows: Rows, artifact_id: int) -> dict[str, Any] | None:
    """An artifact's description (JSON), read only for a winner that carries figures."""
    found = rows.rows("SELECT description FROM artifacts WHERE id = :id", {"id": artifact_id})
    value = as_json(found[0][0]) if found else None
    return value if isinstance(value, dict) else None


def artifact_files(rows: Rows, artifact_id: int) -> list[FileRow]:
    return [FileRow(*r) for r in rows.rows(
        "SELECT name, role, digest, size, media_type FROM artifact_files WHERE artifact_id = :id ORDER BY name",
        {"id": artifact_id})]


def files_and_signatures(rows: Rows, artifact_id: int, artifact_digest: str
                         ) -> tuple[list[FileRow], list[tuple[str, str]]]:
    """An artifact's files and its signatures (oldest first) in one round trip: what a resolve
    hit reads of its winner."""
    files: list[FileRow] = []
    sigs: list[tuple[str, str]] = []
    for kind, _order, name, role, digest, size, media_type, key, sig in rows.rows(
            "SELECT 0, 0, name, role, digest, size, media_type, NULL, NULL FROM artifact_files"
            " WHERE artifact_id = :id"
            " UNION ALL SELECT 1, id, NULL, NULL, NULL, NULL, NULL, public_key, signature FROM signatures"
            " WHERE artifact_digest = :digest ORDER BY 1, 2, 3", {"id": artifact_id, "digest": artifact_digest}):
        if kind == 0:
            files.append(FileRow(name, role, digest, size, media_type))
        else:
            sigs.append((key, sig))
    return files, sigs


def signatures(rows: Rows, artifact_digest: str) -> list[tuple[str, str]]:
    """(public key, signature) of an artifact, oldest first."""
    return [(r[0], r[1]) for r in rows.rows(
        "SELECT public_key, signature FROM signatures WHERE artifact_digest = :digest ORDER BY id",
        {"digest": artifact_digest})]


def model_ref_hit(rows: Rows, ref: str) -> str | None:
    """The model digest ``ref`` names when it names one: a recorded full digest, a NAME:TAG (or
    NAME = NAME:latest) that exists, a unique hex prefix of 6+ digits -- the same order as
    ``registry.index.resolve_model_ref``. Anything else is None: that function explains misses
    (bad names, unknown tags, the tags there are) and is the one to call then."""
    if is_digest(ref):
        return ref if rows.rows("SELECT 1 FROM models WHERE digest = :digest", {"digest": ref}) else None
    if not ref.startswith("sha256:"):
        try:
            name, tag = split_ref(ref)
        except BadNameError:
            pass
        else:
            hit = rows.rows("SELECT model_digest FROM tags WHERE name = :name AND tag = :tag",
                            {"name": name, "tag": tag})
            if hit:
                return str(hit[0][0])
    prefix = ref.removeprefix("sha256:")
    if 6 <= len(prefix) <= 64 and all(c in "0123456789abcdef" for c in prefix):
        hits = rows.rows("SELECT digest FROM models WHERE digest LIKE :pattern LIMIT 2",
                         {"pattern": f"sha256:{prefix}%"})
        if len(hits) == 1:
            return str(hits[0][0])
    return None


def model_generation(rows: Rows, ref: str) -> tuple[str, int] | None:
    """(model digest, its generation) for what ``ref`` names, in one statement, as
    ``model_ref_hit`` finds it (a full digest, an existing NAME:TAG, a unique hex prefix); None
    otherwise. The generation (``model_generations``, bumped by triggers when the model's
    artifacts, verdicts, device reports or signatures change; 0 before any) keys the service's
    cached resolve answers: read first, the answer computed after it is at least that new."""
    for sql, params, unique in generation_statements(ref):
        found = generation_hit(rows.rows(sql, params), unique)
        if found is not None:
            return found
    return None


def generation_statements(ref: str) -> list[tuple[str, dict[str, Any], bool]]:
    """The statements ``model_generation`` tries in turn, ``(sql, params, unique)``, the first
    that finds the model answering (``generation_hit``): the same reads on any connection (the
    service's event loop reads generations with its own driver)."""
    gen = "coalesce((SELECT g.generation FROM model_generations g WHERE g.model_digest = {col}), 0)"
    if is_digest(ref):
        return [(f"SELECT m.digest, {gen.format(col='m.digest')} FROM models m WHERE m.digest = :digest",
                 {"digest": ref}, False)]
    out: list[tuple[str, dict[str, Any], bool]] = []
    if not ref.startswith("sha256:"):
        try:
            name, tag = split_ref(ref)
        except BadNameError:
            pass
        else:
            out.append((f"SELECT t.model_digest, {gen.format(col='t.model_digest')} FROM tags t"
                        " WHERE t.name = :name AND t.tag = :tag", {"name": name, "tag": tag}, False))
    prefix = ref.removeprefix("sha256:")
    if 6 <= len(prefix) <= 64 and all(c in "0123456789abcdef" for c in prefix):
        out.append((f"SELECT m.digest, {gen.format(col='m.digest')} FROM models m"
                    " WHERE m.digest LIKE :pattern LIMIT 2", {"pattern": f"sha256:{prefix}%"}, True))
    return out


def generation_hit(rows: Sequence[Sequence[Any]], unique: bool) -> tuple[str, int] | None:
    """What one of ``generation_statements`` found: its row, if it found one (exactly one when
    ``unique``: a hex prefix names a model only when no other digest starts with it)."""
    found = len(rows) == 1 if unique else bool(rows)
    return (str(rows[0][0]), int(rows[0][1])) if found else None


def models_by_onnx(rows: Rows, onnx_digest: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """(bundle digest, snapshot listing) of every model whose .onnx has this digest."""
    return [(r[0], as_json(r[1])) for r in rows.rows(
        "SELECT digest, files FROM models WHERE onnx_digest = :onnx ORDER BY digest", {"onnx": onnx_digest})]


def tag_digest(rows: Rows, name: str, tag: str) -> str | None:
    hit = rows.rows("SELECT model_digest FROM tags WHERE name = :name AND tag = :tag", {"name": name, "tag": tag})
    return str(hit[0][0]) if hit else None


@dataclass(frozen=True)
class BuildAnswer:
    """A build row and its artifact (if any), as a cached answer needs them."""

    id: int
    toolchain: str
    state: str
    error_code: str | None
    error_message: str | None
    artifact: str | None  # manifest digest
    artifact_status: str | None
    compile_seconds: float | None
    size: int | None
    nodes_ep: int | None
    nodes_cpu: int | None
    backend: str = ""
    target: str = ""
    attempts: int = 0
    worker: str | None = None
    cpu_op_types: list[str] | None = None


def builds_by_key(rows: Rows, keys: list[str]) -> dict[str, BuildAnswer]:
    """Build key -> its row with its artifact's, for the keys that exist (UNIQUE build key)."""
    if not keys:
        return {}
    placeholders, params = in_params("k", list(dict.fromkeys(keys)))
    from dataclasses import replace

    return {r[0]: replace(BuildAnswer(*r[1:16]), cpu_op_types=as_json(r[16])) for r in rows.rows(
        "SELECT b.build_key, b.id, b.toolchain, b.state, b.error_code, b.error_message, a.digest, a.status,"
        " a.compile_seconds, a.size, a.nodes_ep, a.nodes_cpu, b.backend, b.target, b.attempts, b.worker,"
        f" a.cpu_op_types FROM builds b LEFT JOIN artifacts a ON a.build_id = b.id WHERE b.build_key IN ({placeholders})",
        params)}


def live_toolchains(rows: Rows, *, stale_after: float) -> dict[tuple[str, str], list[str]]:
    """(backend, toolchain) -> names of live workers (not stopped, seen within ``stale_after`` s):
    ``registry.index.live_workers``'s rule, for ``plan.served_toolchains``'s answer."""
    from datetime import timedelta

    cutoff = datetime.now(UTC) - timedelta(seconds=stale_after)
    out: dict[tuple[str, str], list[str]] = {}
    for backend, toolchain, name, seen in rows.rows(
            "SELECT backend, toolchain, name, last_seen FROM workers WHERE stopped_at IS NULL"
            " ORDER BY backend, toolchain, name"):
        when = as_datetime(seen)
        if when is not None and when >= cutoff:
            out.setdefault((backend, toolchain), []).append(name)
    return out
