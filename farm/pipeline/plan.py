"""Plan and queue: one submission path, two transports.

A submission validates everything first (names, targets, options, the model bundle: any error
here writes nothing), stores the model snapshot by digest (blobs first), then one transaction
records the model, the tag and a ``queued`` build row per (target, toolchain) (the UNIQUE build
key dedupes against everything built or queued). Then:

- embedded (``build``): this process runs ``Executor.execute`` on each row;
- cluster (``submit_release``): after the commit, a message per row that needs work goes to its
  toolchain queue, and a Celery worker runs the same ``Executor.execute``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from farm.core.bundle import ModelBundle
from farm.core.catalog import Target
from farm.core.errors import (
    CompileTimeoutError,
    FarmError,
    NotFoundError,
    NoWorkerError,
    UsageError,
)
from farm.core.groups import GROUP_FILE, GroupBundle
from farm.core.keys import build_key, options_digest, sha256_file
from farm.core.options import parse_pairs
from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.memory import build_jobs  # noqa: F401 - here too, where callers find the pipeline

# Validation and the report types live where the CLI's fast path can import them without
# SQLAlchemy; re-exported here, where every other caller finds them.
from farm.pipeline.submission import (  # noqa: F401
    VERSION_RE,
    BuildOutcome,
    BuildReport,
    Progress,
    ReleaseRequest,
    ReleaseStatus,
    build_view_of,
    check_name_tag,
    check_versions,
    gate_outcome,
    gate_view,
    no_progress,
    offload_refusal,
    parse_build_request,
    parse_targets,
)
from registry.index import Registry


def load_bundle(registry: Registry, model_path: Path) -> ModelBundle:
    """The bundle for ``model_path``. A model already in the index is recognized by its bytes
    (sha256 of the .onnx and of each recorded data file) without parsing it again."""
    from farm.core.bundle import inspect_model, match_recorded
    from registry.index import find_model_by_onnx

    try:
        is_file = model_path.is_file()
        onnx_digest, onnx_size = sha256_file(model_path) if is_file else ("", 0)
    except OSError:
        is_file = False
    if is_file:
        with registry.db.session() as s:
            known = [(m.digest, m.files) for m in find_model_by_onnx(s, onnx_digest)]
        bundle = match_recorded(model_path, onnx_digest, onnx_size, known)
        if bundle is not None:
            return bundle
    return inspect_model(model_path)


def store_snapshot(registry: Registry, bundle: ModelBundle | GroupBundle) -> list[dict[str, Any]]:
    """Upload the bundle's files by digest (the store verifies each: a file changed since it was
    hashed is refused); existing blobs are skipped. Returns the listing, marked stored."""
    from farm.core.errors import BlobNotFound
    from registry.store.base import put_file

    files = []
    for entry, path in bundle.sources():
        try:
            stored = registry.store.stat(entry["digest"]).size == entry["size"]
        except BlobNotFound:
            stored = False
        if not stored:
            try:
                put_file(registry.store, path, expected=entry["digest"])
            except OSError as exc:
                from farm.core.errors import InvalidModelError

                raise InvalidModelError(f"cannot read {path.name}: {exc.strerror}") from None
        files.append({**entry, "stored": True})
    return files


def record_snapshot(s: Any, digest: str, onnx_digest: str, size: int, files: list[dict[str, Any]] | None,
                    name: str | None, tag: str | None, display: str, *,
                    force_tag: bool = False) -> dict[str, str] | None:
    """The model row for a stored snapshot (``files``; None: already recorded) and its tag.
    Moving the tag to another model needs ``force_tag`` (else tag-conflict, nothing written);
    returns ``{"tag", "from", "to"}`` when the tag moved."""
    from registry.index import record_model, set_tag

    if files is not None:
        m = record_model(s, digest=digest, onnx_digest=onnx_digest, size=size, files=files,
                         name=name or display[:255])
        if not all(f.get("stored") for f in m.files) or [f["path"] for f in m.files] != [f["path"] for f in files]:
            m.files = files  # recorded by an older ctxfarm, before snapshots were stored
    if name and tag:
        return set_tag(s, name, tag, digest, force=force_tag).as_move()
    return None


def check_tag_free(reg: Registry, digest: str, name: str | None, tag: str | None, force_tag: bool) -> None:
    """tag-conflict *before* any blob is stored, so a refused request leaves nothing in the store
    (``record_snapshot`` checks again in its own transaction)."""
    if not (name and tag) or force_tag:
        return
    from sqlalchemy import select

    from registry.index import set_tag
    from registry.models import Tag

    with reg.db.session() as s:
        current = s.scalar(select(Tag.model_digest).where(Tag.name == name, Tag.tag == tag))
        if current is not None and current != digest:
            set_tag(s, name, tag, digest)  # raises tag-conflict, having written nothing


def check_support(matrix: Sequence[tuple[Target, str]], *, group: bool, llm: bool = False) -> None:
    """Weight sharing and multi-SoC refusals (``farm.core.groups.check_build_support``) for
    every (target, toolchain) asked for, before anything is written (``llm``: an LLM's parts)."""
    from farm.core.groups import check_build_support

    for t, version in matrix:
        check_build_support(t, version, group=group, llm=llm)


def _spec(model_digest: str, t: Target, version: str, opts: dict[str, Any]) -> states.BuildSpec:
    od = options_digest(opts)
    return states.BuildSpec(build_key(model_digest, t.backend, t.name, version, od), model_digest, t.backend,
                            t.name, version, opts, od)


# ---- embedded transport ----------------------------------------------------------------------------

def build(settings: Settings, model: str | Path | GroupBundle, target_refs: Sequence[str], option_pairs: Sequence[str] = (),
          *, name: str | None = None, tag: str | None = None, progress: Progress = no_progress,
          registry: Registry | None = None, retry_failed: bool = False, force_tag: bool = False,
          require_full_offload: bool = False) -> BuildReport:
    """Embedded: queue every (target, local toolchain) and run the executor on each, here.
    ``force_tag``: NAME:TAG may move from another model to this one (else tag-conflict).
    ``require_full_offload`` (or ``require_full_offload=true`` among the options): a gate on the
    answer, not on the build (``submission.gate_outcome``)."""
    return build_many(settings, [model], target_refs, option_pairs, name=name, tag=tag, progress=[progress],
                      registry=registry, retry_failed=retry_failed, force_tag=force_tag,
                      require_full_offload=require_full_offload)[0]


def build_many(settings: Settings, models: Sequence[str | Path | GroupBundle], target_refs: Sequence[str],
               option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
               progress: Sequence[Progress] = (), registry: Registry | None = None, retry_failed: bool = False,
               force_tag: bool = False, require_full_offload: bool = False, early: Any = None,
               executors: dict[str, Any] | None = None, pool: Any = None,
               after: Sequence[Callable[[], Any]] = ()) -> list[BuildReport]:
    """Embedded, several models: every (model, target) build shares one pool of ``build_jobs``
    (12 builds on 2 CPUs run 2 at a time across models, not model by model). A report per model,
    in the order given; ``progress[i]`` hears models[i]'s events. Everything is validated and
    every model's snapshot and builds are recorded before the first compile starts, except the
    compiles ``early`` (``farm.pipeline.early.start``, the CLI's) started before the pipeline:
    a claimed build adopts the one that is exactly its own compile. The caller closes ``early``.
    ``name``/``tag`` name one model: with several, a usage error. ``executors`` (by backend) and
    ``pool`` (a thread pool the caller owns and shuts down): the caller's, shared with the work
    it queues behind these builds, ``after`` (a genai package's twin builds): submitted to the
    pool once every build is, never waited for here."""
    from farm.pipeline.execute import Executor, interruptible
    from workers.backends import get_runner

    if not models:
        raise UsageError("no model given", hint="farm build MODEL.onnx [MODEL.onnx ...] -t qnn:SM8650")
    if len(models) > 1 and (name or tag or force_tag):
        raise UsageError("--name/--tag name one model; several models were given",
                         hint="build the named model in its own `farm build --name N --tag T`")
    req = parse_build_request(target_refs, option_pairs, name, tag, require_full_offload)
    name, tag, targets, options, gated = req.name, req.tag, req.targets, req.options, req.gated
    executors = dict(executors or {})
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        for t in targets:
            if t.backend not in executors:
                try:
                    executors[t.backend] = Executor(settings, reg, get_runner(t.backend), early=early)
                except FarmError as exc:
                    raise NoWorkerError(f"cannot build {t.ref} here: {exc.message}", hint=exc.hint) from None
        # invalid-model before anything is written; a graph group comes inspected (farm.core.groups)
        bundles = [m if isinstance(m, GroupBundle) else load_bundle(reg, Path(m)) for m in models]
        check_support([(t, executors[t.backend].toolchain.version) for t in targets],
                      group=any(isinstance(b, GroupBundle) for b in bundles))
        reports: list[BuildReport] = []
        planned: list[tuple[Target, states.BuildSpec, int, Progress]] = []
        for bundle in bundles:
            check_tag_free(reg, bundle.digest, name, tag, force_tag)
        for i, bundle in enumerate(bundles):
            files = store_snapshot(reg, bundle)
            listen = progress[i] if i < len(progress) else no_progress
            with reg.db.session() as s:
                moved_from = record_snapshot(s, bundle.digest, bundle.onnx.digest, bundle.size, files, name, tag,
                                             bundle.stem, force_tag=force_tag)
                for t in targets:
                    spec = _spec(bundle.digest, t, executors[t.backend].toolchain.version, options[t])
                    build_id, _ = states.enqueue(s, spec, None, retry_failed=retry_failed)
                    planned.append((t, spec, build_id, listen))
            reports.append(BuildReport(bundle.digest, name or bundle.stem, tag, tag_moved=moved_from))
        with interruptible():
            outcomes = _run_all(settings, reg, executors, planned, gate=gated, pool=pool, after=after)
        for i, report in enumerate(reports):
            report.outcomes.extend(outcomes[i * len(targets):(i + 1) * len(targets)])
        return reports
    finally:
        if own:
            reg.close()


def _run_all(settings: Settings, reg: Registry, executors: dict[str, Any],
             planned: list[tuple[Target, states.BuildSpec, int, Progress]], *, gate: bool = False,
             pool: Any = None, after: Sequence[Callable[[], Any]] = ()) -> list[BuildOutcome]:
    """Run the planned builds here, ``build_jobs`` at a time (each compile in its own warm host,
    workers.host: no process started per target). Outcomes in the order planned.

    In parallel, builds run in threads while SIGTERM/SIGINT arrive in the main thread: there the
    ``Interrupted`` sets the executors' ``interrupt``, each running compile stops and releases its
    lease in its own thread, builds not yet started do not start, and once all have unwound the
    main thread raises the signal on."""
    jobs = build_jobs(settings, len(planned))
    if jobs <= 1 and pool is None:
        return [_run_here(reg, executors[t.backend], t, spec, build_id, progress, gate=gate)
                for t, spec, build_id, progress in planned]
    from concurrent.futures import ThreadPoolExecutor, wait

    from farm.core.errors import Interrupted
    from farm.pipeline.execute import Interruption

    stop = Interruption()
    for ex in executors.values():
        ex.interrupt = stop

    def one(t: Target, spec: states.BuildSpec, build_id: int, progress: Progress) -> BuildOutcome:
        if stop.is_set():
            raise Interrupted(stop.signum)
        return _run_here(reg, executors[t.backend], t, spec, build_id, progress, stop=stop, gate=gate)

    owned = pool is None
    pool = pool or ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="build")
    futures = []
    try:
        for t, spec, build_id, progress in planned:
            futures.append(pool.submit(one, t, spec, build_id, progress))
        for job in after:  # behind every build: taken by the pool's threads as they come free
            pool.submit(job)
        wait(futures)
    except BaseException as exc:
        stop.set(getattr(exc, "signum", 2))
        wait(futures)  # every compile stops and gives its build back before we go on
        raise
    else:
        return [f.result() for f in futures]
    finally:
        if owned:
            pool.shutdown(wait=True, cancel_futures=True)
        for ex in executors.values():
            ex.interrupt = None


def _run_here(reg: Registry, executor: Any, t: Target, spec: states.BuildSpec, build_id: int,
              progress: Progress, *, stop: Any = None, gate: bool = False) -> BuildOutcome:
    from farm.pipeline.execute import wait_until_final_or_free

    ran = False
    start = time.perf_counter()
    while True:
        if stop is not None and stop.is_set():
            from farm.core.errors import Interrupted

            raise Interrupted(stop.signum)
        with reg.db.session() as s:
            b = states.get_build(s, build_id)
            state, attempt = b.state, b.attempts
        if state in states.FINAL:
            break
        if state == states.BuildState.RUNNING and not ran:
            progress("waiting", t.ref, {"build_id": build_id})
        else:
            progress("compiling", t.ref, {"toolchain": spec.toolchain, "attempt": attempt + 1})
        r = executor.execute(build_id)
        ran = ran or r.outcome in ("succeeded", "failed", "retry", "exhausted")
        if r.outcome == "busy" or r.outcome == "lost":
            wait_until_final_or_free(reg, build_id)
        elif r.outcome == "retry":
            progress("retrying", t.ref, {"in_seconds": r.countdown})
            if stop is not None:
                stop.wait(r.countdown)
            else:
                time.sleep(r.countdown)
    outcome = outcome_from_row(reg, build_id, t.ref, cached=not ran, gate=gate)
    outcome.wall_seconds = time.perf_counter() - start
    progress("finished", t.ref, outcome.to_dict())
    return outcome


def outcome_from_row(reg: Registry, build_id: int, ref: str, *, cached: bool, gate: bool = False) -> BuildOutcome:
    """The outcome of a final build; ``gate``: as a --require-full-offload request sees it."""
    from registry.index import artifact_for_build
    from registry.manifest import cpu_op_types

    with reg.db.session() as s:
        b = states.get_build(s, build_id)
        if b.state == states.BuildState.SUCCEEDED:
            a = artifact_for_build(s, build_id)
            if a is None:
                raise NotFoundError(f"build {build_id} succeeded but has no artifact",
                                    hint="run `farm registry verify`")
            outcome = BuildOutcome(ref, b.toolchain, "cached" if cached else "built", b.id, artifact=a.digest,
                                   compile_seconds=a.compile_seconds, size=a.size, nodes_ep=a.nodes_ep,
                                   nodes_cpu=a.nodes_cpu, cpu_op_types=a.cpu_op_types)
            digest = a.digest
            return gate_outcome(outcome, lambda: cpu_op_types(reg.store, digest)) if gate else outcome
        return BuildOutcome(ref, b.toolchain, "failed", b.id, error_code=b.error_code,
                            error_message=b.error_message, cached_failure=cached)


# ---- cluster transport -----------------------------------------------------------------------------

def served_toolchains(settings: Settings, reg: Registry) -> dict[tuple[str, str], list[str]]:
    """(backend, toolchain) -> names of live workers serving it."""
    from registry.index import live_workers

    with reg.db.session() as s:
        out: dict[tuple[str, str], list[str]] = {}
        for w in live_workers(s, stale_after=settings.worker_stale_after):
            out.setdefault((w.backend, w.toolchain), []).append(w.name)
    return out


def submit_release(settings: Settings, model: str | Path | GroupBundle, target_refs: Sequence[str], sdks: Sequence[str] = (),
                   option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
                   allow_queue: bool = False, registry: Registry | None = None, app: Any = None,
                   retry_failed: bool = False, force_tag: bool = False,
                   require_full_offload: bool = False, min_psnr: float | None = None) -> ReleaseStatus:
    """Cluster, from a model file: validate, then ``queue_release``."""
    name, tag = check_name_tag(name, tag)
    own = registry is None
    reg = registry or Registry.open(settings)
    try:
        request = ReleaseRequest.parse(target_refs, sdks, parse_pairs(option_pairs), name, tag, allow_queue,
                                       retry_failed, force_tag, require_full_offload, min_psnr)
        served = served_toolchains(settings, reg)
        request.check_served(served)
        bundle = model if isinstance(model, GroupBundle) else load_bundle(reg, Path(model))
        check_support(request.matrix(served), group=isinstance(bundle, GroupBundle))
        return queue_release(settings, reg, bundle.digest, request, served=served, app=app,
                             store=lambda: store_snapshot(reg, bundle), display=bundle.stem,
                             onnx_digest=bundle.onnx.digest, size=bundle.size)
    finally:
        if own:
            reg.close()


def queue_release(settings: Settings, reg: Registry, model_digest: str, request: ReleaseRequest, *,
                  served: dict[tuple[str, str], list[str]], app: Any = None,
                  store: Callable[[], list[dict[str, Any]]] | None = None, display: str = "",
                  onnx_digest: str = "", size: int = 0, dispatch: bool = True,
                  owner: int | None = None) -> ReleaseStatus:
    """Record the release and its queued builds in one transaction, then send the messages.
    ``store`` uploads the model snapshot (blobs first); a model already stored passes None.
    ``dispatch=False``: no broker, the caller runs the queued builds itself (the embedded service).
    ``owner``: the id of the token that submitted it through the service (only it or an admin
    cancels the release).

    A re-submission whose builds are all answered by the index (succeeded, or failed for a
    deterministic reason) is one transaction of a few statements: read the builds with their
    artifacts, record the tag and the release, answer from what was read."""
    from farm.pipeline.queues import COMPILE_TASK, check_broker, compile_queue, send, shared_app
    from registry.index import artifact_for_build, release_builds
    from registry.models import Release, ReleaseBuild

    matrix = request.matrix(served)
    # Sharing and multi-SoC refusals for every front door (the HTTP service's too): a group is
    # looked up only where a target would refuse one (below v73, multi-SoC, not QNN).
    if any(t.multi_soc or t.backend != "qnn" or (t.htp_arch_number or 0) < 73 for t, _ in matrix):
        check_support(matrix, group=is_group(reg, model_digest))
    specs = [(t, v, _spec(model_digest, t, v, request.options[t])) for t, v in matrix]
    label = f"{request.name}:{request.tag}" if request.name else (display[:255] or model_digest[:19])
    release_matrix = {"targets": [t.ref for t, _ in matrix], "toolchains": [v for _, v in matrix],
                      "options": request.raw_options, "require_full_offload": request.require_full_offload}
    if request.min_psnr is not None:
        release_matrix["min_psnr"] = request.min_psnr
    with reg.db.session() as s:
        cached, needs_work = _answer_cached(s, model_digest, [spec.build_key for _, _, spec in specs], request,
                                            label, release_matrix, check_stored=store is not None,
                                            blobs=reg.store, owner=owner)
    if cached is not None:
        return cached
    if needs_work and dispatch:
        # Something will be sent: the broker must answer before anything is written.
        app = app or shared_app(settings)
        check_broker(app)
    if store is not None:
        check_tag_free(reg, model_digest, request.name, request.tag, request.force_tag)
    files = store() if store is not None else None
    to_send: list[tuple[int, str]] = []
    with reg.db.session() as s:
        moved_from = record_snapshot(s, model_digest, onnx_digest, size, files, request.name, request.tag, display,
                                     force_tag=request.force_tag)
        release = Release(model_digest=model_digest, label=label, matrix=release_matrix, owner_token_id=owner)
        s.add(release)
        s.flush()
        for t, version, spec in specs:
            hw_compat = spec.options.get("hardware_compatibility_level") == "ampere_plus"
            queue = compile_queue(t.backend, version, "ampere_plus" if hw_compat else t.name)
            build_id, queued = states.enqueue(s, spec, queue, retry_failed=request.retry_failed)
            s.add(ReleaseBuild(release_id=release.id, build_id=build_id))
            if queued and dispatch:
                to_send.append((build_id, queue))
        release_id = release.id
    # After the commit: a worker that gets the message finds the row.
    if to_send and app is None:
        app = shared_app(settings)
    for build_id, queue in to_send:
        send(app, COMPILE_TASK, [build_id], queue)
    if request.min_psnr is not None:
        from farm.pipeline.accuracy import schedule

        # Builds already succeeded get their check now; new ones when their worker publishes.
        with reg.db.session() as s:
            built = [a.id for b in release_builds(s, release_id) if (a := artifact_for_build(s, b.id)) is not None]
        schedule(settings, reg, built)
    with reg.db.session() as s:
        st = _status(s, release_id, release_builds(s, release_id), reg.store)
    st.tag_moved = moved_from
    return st


def _answer_cached(s: Any, model_digest: str, keys: list[str], request: ReleaseRequest, label: str,
                   release_matrix: dict[str, Any], *, check_stored: bool, blobs: Any = None,
                   owner: int | None = None) -> tuple[ReleaseStatus | None, bool]:
    """In the caller's transaction: when every build of ``keys`` is final and stays so
    (``enqueue``'s rules reopen none) and the model snapshot is stored, record the tag and the
    release and return (its status, False). Else (None, whether some build needs work: new,
    or to be reopened), having written nothing."""
    from sqlalchemy import insert, select

    from farm.core.errors import DETERMINISTIC_FAILURES
    from registry.models import Artifact, Build, Model, Release, ReleaseBuild

    rows = {b.build_key: (b, a) for b, a in s.execute(
        select(Build, Artifact).outerjoin(Artifact, Artifact.build_id == Build.id).where(Build.build_key.in_(keys)))}
    in_flight = False
    for k in keys:
        if k not in rows:
            return None, True
        b, a = rows[k]
        if b.state == states.BuildState.SUCCEEDED:
            if a is not None and a.status == "broken":
                return None, True
        elif b.state == states.BuildState.FAILED:
            if request.retry_failed or b.error_code not in DETERMINISTIC_FAILURES:
                return None, True
        else:
            in_flight = True  # queued or running: its message was sent by whoever queued it
    if in_flight or request.min_psnr is not None:
        # --min-psnr: the accuracy gate reads (and may start) checks on the full path
        return None, False
    if check_stored:
        files = s.scalar(select(Model.files).where(Model.digest == model_digest))
        if not files or not all(f.get("stored") for f in files):
            return None, False  # recorded by an older ctxfarm, before snapshots were stored
    moved_from = None
    if request.name and request.tag:
        from registry.index import set_tag

        move = set_tag(s, request.name, request.tag, model_digest, force=request.force_tag)
        moved_from = move.as_move()
    release_id = s.scalar(insert(Release).values(model_digest=model_digest, label=label, matrix=release_matrix,
                                                 created_at=states.now(), owner_token_id=owner)
                          .returning(Release.id))
    s.execute(insert(ReleaseBuild), [{"release_id": release_id, "build_id": rows[k][0].id}
                                     for k in dict.fromkeys(keys)])
    st = ReleaseStatus(int(release_id), label, tag_moved=moved_from)
    for b, a in sorted((rows[k] for k in dict.fromkeys(keys)), key=lambda r: (r[0].target, r[0].toolchain)):
        view = build_view(b, a if b.state == states.BuildState.SUCCEEDED else None)
        st.builds.append(_gate_view(view, a, blobs) if request.require_full_offload else view)
    return st, False


def build_view(b: Any, art: Any) -> dict[str, Any]:
    """One build as status shows it (also for a single build)."""
    note = None
    if states.lease_expired(b):
        note = "lease expired, waiting for a worker"
    elif b.state == states.BuildState.QUEUED and b.error_code:
        note = f"retrying after {b.error_code}"
    return build_view_of(b, art.digest if art else None, art.compile_seconds if art else None, note,
                         nodes_cpu=art.nodes_cpu if art else None, cpu_op_types=art.cpu_op_types if art else None)


def _gate_view(view: dict[str, Any], art: Any, blobs: Any) -> dict[str, Any]:
    """``submission.gate_view``, the op types read from the artifact's manifest in ``blobs``."""
    from registry.manifest import cpu_op_types

    if art is None:
        return view
    return gate_view(view, art.nodes_cpu, lambda: cpu_op_types(blobs, art.digest))


def _status(session: Any, release_id: int, builds: list[Any], blobs: Any) -> ReleaseStatus:
    """The release's builds as its request sees them (``blobs``: the store, for the op types a
    --require-full-offload release names)."""
    from registry.index import artifact_for_build
    from registry.models import Release

    rel = session.get(Release, release_id)
    st = ReleaseStatus(release_id, rel.label if rel else "")
    gated = bool(rel is not None and (rel.matrix or {}).get("require_full_offload"))
    min_psnr = (rel.matrix or {}).get("min_psnr") if rel is not None else None
    for b in builds:
        art = artifact_for_build(session, b.id) if b.state == states.BuildState.SUCCEEDED else None
        view = build_view(b, art)
        view = _gate_view(view, art, blobs) if gated else view
        if min_psnr is not None:
            from farm.pipeline.accuracy import release_gate_view

            view = release_gate_view(session, view, art, float(min_psnr))
        st.builds.append(view)
    if rel is not None and (rel.matrix or {}).get("genai"):
        from registry.index import genai_roles

        roles = genai_roles(session, [v["build"] for v in st.builds])
        for view in st.builds:
            view["part"] = roles.get(view["build"])
    return st


MAX_ID = 2**31 - 1


def check_id(value: int, what: str) -> int:
    if not 0 < value <= MAX_ID:
        raise UsageError(f"{what} {value} is out of range", hint=f"ids are 1..{MAX_ID}")
    return value


def release_status(settings: Settings, release_id: int, registry: Registry | None = None) -> ReleaseStatus:
    from registry.index import release_builds
    from registry.models import Release

    check_id(release_id, "release")
    reg = registry or Registry.open(settings)
    try:
        with reg.db.session() as s:
            if s.get(Release, release_id) is None:
                raise NotFoundError(f"no release {release_id}")
            return _status(s, release_id, release_builds(s, release_id), reg.store)
    finally:
        if registry is None:
            reg.close()


def wait_release(settings: Settings, release_id: int, *, timeout: float | None = None, poll: float = 10.0,
                 on_change: Callable[[ReleaseStatus], None] | None = None,
                 registry: Registry | None = None, events: Any = None) -> ReleaseStatus:
    """Wait until every build of the release is final (fan-in in SQL, not chords).

    Woken by build events (``farm.pipeline.events``: Redis pub/sub on the broker, published by
    the executor after each commit), subscribed before the first read so no change is missed;
    SQL is read again only when one of this release's builds changed. ``poll`` is the fallback
    for a lost event or connection, not the pace. ``events``: a Subscription to reuse."""
    from farm.pipeline.events import Subscription

    reg = registry or Registry.open(settings)
    deadline = None if timeout is None else time.monotonic() + timeout
    last: Any = None
    sub = events if events is not None else Subscription(settings.broker_url).__enter__()
    try:
        while True:
            st = release_status(settings, release_id, registry=reg)
            snapshot = [(b["build"], b["state"], b["attempts"], b["note"]) for b in st.builds]
            if snapshot != last and on_change:
                on_change(st)
            last = snapshot
            if st.done:
                return st
            left = poll if deadline is None else min(poll, deadline - time.monotonic())
            if left <= 0:
                raise CompileTimeoutError(f"release {release_id} not finished after {timeout:g} s",
                                          hint=f"it keeps running; `farm status {release_id}` shows progress")
            sub.wait({b["build"] for b in st.builds}, left)
    finally:
        if events is None:
            sub.close()
        if registry is None:
            reg.close()


def watch_release(settings: Settings, release_id: int, *, wait: float,
                  registry: Registry | None = None) -> ReleaseStatus:
    """The HTTP service's long poll: the release's status at once when it is done, else once
    one of its builds changed or after ``wait`` seconds. Subscribed before the read (a change
    after it wakes us); a change before it is in what is read. Woken by build events."""
    from farm.pipeline.events import Subscription

    if wait <= 0:
        return release_status(settings, release_id, registry=registry)
    with Subscription(settings.broker_url) as sub:
        st = release_status(settings, release_id, registry=registry)
        if st.done:
            return st
        if sub.wait({b["build"] for b in st.builds}, wait):
            st = release_status(settings, release_id, registry=registry)
        return st


def is_group(reg: Registry, model_digest: str) -> bool:
    """Whether the recorded model ``model_digest`` is a graph group (its snapshot starts with
    group.json)."""
    from registry.models import Model

    with reg.db.session() as s:
        files = s.get(Model, model_digest)
        listing = files.files if files is not None else []
    return bool(listing) and listing[0].get("path") == GROUP_FILE
