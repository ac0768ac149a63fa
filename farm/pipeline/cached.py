"""A cached embedded build answered from the index alone: the CLI's fast path for ``farm build``.

``answer`` returns the report ``plan.build`` would return when ``plan.build`` would write
nothing and compile nothing, and None in every other case; the caller then runs ``plan.build``
(one pipeline: this path never queues, claims, uploads or records anything). It imports no
SQLAlchemy, no onnx and no onnxruntime, and reads the index over a bare connection
(``registry.lite``) in one read-only transaction.

What it checks, in order; the first "no" gives None:

1. The request, with plan.build's own validation (``farm.pipeline.submission``, options
   ``normalize``): a bad name, target or option raises the very same error here.
2. Each backend's toolchain is installed here (``get_runner(...).toolchain()``, package metadata
   only); its version goes into the build keys, as plan.build's executors do.
3. The index opens: an existing SQLite file or a reachable server, schema at this ctxfarm's
   head (one-row read of alembic_version). A fresh FARM_HOME, an older or newer schema go to the
   full path, which creates, upgrades or raises ``schema-mismatch``.
4. The model is one the index recorded: the sha256 of the .onnx bytes matches ``models.onnx_digest``
   and every recorded external-data file is a regular file inside the model's directory (after
   symlinks) whose sha256 matches its recorded digest (``farm.core.bundle.match_recorded``). The
   .onnx is not parsed: the same bytes name the same external-data locations and ranges, which
   were validated when the model was first recorded. A modified model or data file, same name or
   not, has another digest and takes the full path (inspection, snapshot, compile).
5. The recorded snapshot is marked stored (every file uploaded by digest). The store itself is
   not asked: a cached answer needs no model blob, and any build that needs work takes the full
   path, which stats (and re-uploads) the snapshot.
6. ``--name``: NAME:TAG already points at this model (a new or moved tag is a write).
7. Every build key exists and ``states.enqueue`` would reopen none of them: succeeded with an
   artifact that is not marked broken, or failed with a deterministic code and no
   ``--retry-failed``. Queued and running builds take the full path (it waits or runs them).

``--require-full-offload`` is not in the build keys: a gated request is answered here from the
ungated build, failed with unsupported-ops where the artifact left CPU nodes (their op types read
from its manifest in the store, only then).

``resubmit`` is the same for a cached ``farm submit`` (cluster, no ``--server``), with one write:
the release row and its builds, in one transaction over the same bare connection.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from farm.core.errors import DETERMINISTIC_FAILURES, FarmError
from farm.core.keys import build_key, options_digest, sha256_file
from farm.core.settings import Settings
from farm.pipeline.submission import (
    BuildOutcome,
    BuildReport,
    Progress,
    ReleaseStatus,
    build_view_of,
    gate_outcome,
    gate_view,
    no_progress,
    parse_build_request,
)


def answer(settings: Settings, model: str | Path, target_refs: Sequence[str], option_pairs: Sequence[str] = (),
           *, name: str | None = None, tag: str | None = None, progress: Progress = no_progress,
           retry_failed: bool = False, require_full_offload: bool = False) -> BuildReport | None:
    """The report of a fully cached ``plan.build(...)`` with these arguments, or None (see the
    module docstring). Raises what plan.build's validation raises, nothing else of its own."""
    from registry.lite import open_index
    from registry.reads import builds_by_key
    from workers.backends import get_runner

    start = time.perf_counter()
    req = parse_build_request(target_refs, option_pairs, name, tag, require_full_offload)
    name, tag, targets, options, gated = req.name, req.tag, req.targets, req.options, req.gated
    toolchains: dict[str, str] = {}
    for t in targets:
        if t.backend not in toolchains:
            try:
                toolchains[t.backend] = get_runner(t.backend).toolchain().version
            except FarmError:
                return None  # the full path says which toolchain is missing (no-worker)
    model_file = _model_file(model)
    if model_file is None:
        return None
    index = open_index(settings.database_url)
    if index is None:
        return None
    with index:
        bundle = _stored_bundle(index, model_file, name, tag)
        if bundle is None:
            return None
        keys = {t: build_key(bundle.digest, t.backend, t.name, toolchains[t.backend], options_digest(options[t]))
                for t in targets}
        rows = builds_by_key(index, list(keys.values()))
    outcomes = []
    for t in targets:
        b = rows.get(keys[t])
        if b is None:
            return None
        if b.state == "succeeded":
            if b.artifact is None or b.artifact_status == "broken":
                return None
            outcome = BuildOutcome(t.ref, b.toolchain, "cached", b.id, artifact=b.artifact,
                                   compile_seconds=b.compile_seconds, size=b.size, nodes_ep=b.nodes_ep,
                                   nodes_cpu=b.nodes_cpu, cpu_op_types=b.cpu_op_types)
            outcomes.append(gate_outcome(outcome, _op_types(settings, b.artifact)) if gated else outcome)
        elif b.state == "failed" and not retry_failed and b.error_code in DETERMINISTIC_FAILURES:
            outcomes.append(BuildOutcome(t.ref, b.toolchain, "failed", b.id, error_code=b.error_code,
                                         error_message=b.error_message, cached_failure=True))
        else:
            return None
    took = time.perf_counter() - start
    for o in outcomes:
        o.wall_seconds = took
        progress("finished", o.target, o.to_dict())
    return BuildReport(bundle.digest, name or bundle.stem, tag, outcomes)


def _model_file(model: str | Path) -> tuple[Path, str, int] | None:
    """(path, sha256 of the .onnx bytes, size), or None when it is not a readable file (the full
    path says why)."""
    path = Path(model)
    try:
        if not path.is_file():
            return None
        digest, size = sha256_file(path)
    except OSError:
        return None
    return path, digest, size


def _stored_bundle(index: Any, model_file: tuple[Path, str, int], name: str | None, tag: str | None) -> Any:
    """The recorded bundle these bytes are (external data re-hashed), with every file stored and
    NAME:TAG, when given, already on it; else None."""
    from farm.core.bundle import match_recorded
    from registry.reads import models_by_onnx, tag_digest

    path, onnx_digest, onnx_size = model_file
    recorded = models_by_onnx(index, onnx_digest)
    bundle = match_recorded(path, onnx_digest, onnx_size, recorded)
    if bundle is None:
        return None
    listing = dict(recorded)[bundle.digest]
    if not listing or not all(f.get("stored") for f in listing):
        return None
    if name and tag and tag_digest(index, name, tag) != bundle.digest:
        return None
    return bundle


def _op_types(settings: Settings, manifest_digest: str) -> Callable[[], list[str]]:
    def read() -> list[str]:
        from registry.manifest import cpu_op_types
        from registry.store import open_store

        return cpu_op_types(open_store(settings.store_url), manifest_digest)

    return read


# ---- a cached `farm submit` (cluster) -------------------------------------------------------------

def resubmit(settings: Settings, model: str | Path, target_refs: Sequence[str], sdks: Sequence[str] = (),
             option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
             allow_queue: bool = False, retry_failed: bool = False, force_tag: bool = False,
             require_full_offload: bool = False, min_psnr: float | None = None) -> ReleaseStatus | None:
    """What ``plan.submit_release`` returns for a release the index answers whole (every build
    final and not reopened), recorded over a bare connection in one transaction: the release row
    and its builds. None in every other case, having written nothing; the caller then runs
    ``submit_release`` (it records the tag, stores the snapshot, queues and sends).

    The same checks as ``answer`` (request, schema head, model by its bytes, snapshot stored,
    NAME:TAG already on this model, so ``--force-tag`` moves nothing) plus the live workers: the
    toolchains come from them when no ``--sdk`` is given, and an unserved one raises ``no-worker``
    as the full path does (unless ``--allow-queue``). ``--require-full-offload`` fails the builds
    whose artifact left CPU nodes (their op types read from its manifest in the store, only then)."""
    from farm.core.options import parse_pairs
    from farm.pipeline.submission import ReleaseRequest
    from registry.lite import open_index
    from registry.reads import builds_by_key, live_toolchains

    request = ReleaseRequest.parse(target_refs, sdks, parse_pairs(option_pairs), name, tag, allow_queue,
                                   retry_failed, force_tag, require_full_offload, min_psnr)
    if request.min_psnr is not None:
        return None  # the accuracy gate reads (and may start) checks: the full path
    model_file = _model_file(model)
    if model_file is None:
        return None
    index = open_index(settings.database_url, write=True)
    if index is None:
        return None
    with index:
        served = live_toolchains(index, stale_after=settings.worker_stale_after)
        request.check_served(served)
        bundle = _stored_bundle(index, model_file, request.name, request.tag)
        if bundle is None:
            return None
        matrix = request.matrix(served)
        keys = [build_key(bundle.digest, t.backend, t.name, v, options_digest(request.options[t])) for t, v in matrix]
        rows = builds_by_key(index, keys)
        builds = []
        for k in dict.fromkeys(keys):
            b = rows.get(k)
            if b is None:
                return None
            if b.state == "succeeded":
                if b.artifact is None or b.artifact_status == "broken":
                    return None
            elif b.state != "failed" or retry_failed or b.error_code not in DETERMINISTIC_FAILURES:
                return None  # queued or running (the full path answers it), or to be reopened
            builds.append(b)
        label = f"{request.name}:{request.tag}" if request.name else (bundle.stem[:255] or bundle.digest[:19])
        views = []
        for b in sorted(builds, key=lambda b: (b.target, b.toolchain)):
            ok = b.state == "succeeded"
            view = build_view_of(b, b.artifact if ok else None, b.compile_seconds if ok else None,
                                 nodes_cpu=b.nodes_cpu if ok else None, cpu_op_types=b.cpu_op_types if ok else None)
            if request.require_full_offload and ok and b.artifact is not None:
                # Before the commit, as the full path: a manifest that cannot be read records nothing.
                view = gate_view(view, b.nodes_cpu, _op_types(settings, b.artifact))
            views.append(view)
        release_id = _record_release(index, bundle.digest, label, {
            "targets": [t.ref for t, _ in matrix], "toolchains": [v for _, v in matrix],
            "options": request.raw_options, "require_full_offload": request.require_full_offload},
            [b.id for b in builds])
        index.commit()
    return ReleaseStatus(release_id, label, views)


def _record_release(index: Any, model_digest: str, label: str, matrix: dict[str, Any], build_ids: list[int]) -> int:
    """The release row and its builds, in the index's open transaction (as SQLAlchemy would
    store them: JSON text, and on SQLite UTC timestamps as naive text)."""
    import json
    from datetime import UTC, datetime

    created: Any = datetime.now(UTC)
    if index.dialect == "sqlite":
        created = created.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    (release_id,), = index.rows(
        "INSERT INTO releases (model_digest, label, matrix, created_at) VALUES (:m, :label, :matrix, :created)"
        " RETURNING id", {"m": model_digest, "label": label, "matrix": json.dumps(matrix), "created": created})
    for build_id in build_ids:
        index.rows("INSERT INTO release_builds (release_id, build_id) VALUES (:r, :b)",
                   {"r": release_id, "b": build_id})
    return int(release_id)
