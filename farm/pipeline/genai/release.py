"""A genai package released: embedded (``build_package``: every part's group in one pool, then
the fan-in per target here) and on the cluster (``submit_package``: the parts to the workers,
the package builds sent when their last part is final, ``after_part``; ``execute_package`` on the
worker that takes one)."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast

from farm.core.errors import FarmError
from farm.core.settings import Settings
from farm.pipeline.genai.assembly import _fail, assemble
from farm.pipeline.genai.bundle import (
    PackageBundle,
    PackageReport,
    inspect_package,
    package_from_snapshot,
    store_package,
)
from farm.pipeline.genai.links import link_parts, ready_packages
from farm.pipeline.genai.twin import _then_twin, _with_twin, twin_after
from farm.pipeline.genai.twin_builds import (
    enqueue_twins,
    pool_job,
    reopen_cancelled_twin,
    twin_job,
    twin_orphaned,
    twin_spec,
    twin_wanted,
    twins_wanted,
)
from farm.pipeline.genai.twin_record import _description, record_twin, twin_status
from farm.pipeline.submission import BuildReport, Progress, no_progress

log = logging.getLogger("ctxfarm.genai")


def build_package(settings: Settings, export_dir: str | Path, target_refs: Sequence[str],
                  option_pairs: Sequence[str] = (), *, name: str | None = None, tag: str | None = None,
                  progress: Progress = no_progress, part_progress: Callable[[int], Progress] | None = None,
                  retry_failed: bool = False, force_tag: bool = False, twin: bool = True,
                  require_twin: bool = False,
                  published: Callable[[PackageReport], None] | None = None) -> PackageReport:
    """Embedded ``farm build --genai``: validate everything, record the package (and NAME:TAG),
    build the parts' groups in one pool, then assemble, check and publish the package per
    target. Published is not verified: the package is final (resolvable, installable) once its
    folder check passes, a ``published`` progress event says when, and ``published`` is called
    with the answer as it stands then (the twin ``pending``). ``twin``: then the twin runs in
    this call (budgeted) and is recorded on the artifact, evidence on a published package, never
    a failed build; also for a cached package whose twin is missing or still pending (built with
    --no-twin, or a command interrupted during its twin). ``require_twin``: the returned answer is
    gated on it (a twin that did not match every token, or could not run, is ``twin-mismatch``;
    the artifact stays published)."""
    from farm.core.capabilities import check_genai_backends, check_here
    from farm.pipeline import states
    from farm.pipeline.execute import Executor, Interruption, interruptible, wait_until_final_or_free
    from farm.pipeline.plan import (
        _spec,
        build_jobs,
        build_many,
        check_support,
        outcome_from_row,
        parse_build_request,
        record_snapshot,
    )
    from registry.index import Registry
    from workers.backends import get_runner
    from workers.capabilities import here

    req = parse_build_request(target_refs, option_pairs, name, tag, False)
    check_genai_backends([t.backend for t in req.targets])
    for backend in dict.fromkeys(t.backend for t in req.targets):  # before anything is read, recorded or compiled
        check_here(backend, get_runner(backend).toolchain().version, here(backend))
    pkg = inspect_package(settings, export_dir, display=name)
    reg = Registry.open(settings)
    pool: ThreadPoolExecutor | None = None
    stop = Interruption()
    try:
        executors: dict[str, Any] = {}
        for t in req.targets:
            if t.backend not in executors:
                executors[t.backend] = Executor(settings, reg, get_runner(t.backend))
        versions = {b: ex.toolchain.version for b, ex in executors.items()}
        check_support([(t, versions[t.backend]) for t in req.targets], group=True, llm=True)
        files = store_package(reg, pkg)  # a snapshot like a model's (digest, sources), and each part's
        planned = []
        with reg.db.session() as s:
            moved = record_snapshot(s, pkg.digest, pkg.onnx.digest, pkg.size, files, req.name, req.tag,
                                    pkg.stem, force_tag=force_tag)
            for t in req.targets:
                spec = _spec(pkg.digest, t, versions[t.backend], req.options[t])
                build_id, _ = states.enqueue(s, spec, None, retry_failed=retry_failed)
                planned.append((t, spec, build_id))
        report = BuildReport(pkg.digest, req.name or pkg.stem, req.tag, tag_moved=moved)
        with reg.db.session() as s:
            final = all(states.get_build(s, b).state in states.FINAL for _, _, b in planned)
        # Each part's twin build per target whose twin will run, in the same pool behind the part
        # builds (publication wins: the pool takes them last, they are admitted after any compile
        # that waits, their children run niced): they start as soon as a thread is free.
        twin_specs = twins_wanted(reg, pkg, planned) if twin else {}
        jobs_of: dict[int, tuple[list[Any], list[Future[Any]]]] = {}
        after: list[Callable[[], Any]] = []
        by_key: dict[str, Future[Any]] = {}  # two SoCs of one HTP arch share their twin builds: one job each
        for k, specs in twin_specs.items():
            ex = executors[planned[k][0].backend]
            futures: list[Future[Any]] = []
            for one in specs:
                fut = by_key.get(one.build_key)
                if fut is None:
                    fut = by_key[one.build_key] = Future()
                    after.append(pool_job(fut, partial(twin_job, ex, one, stop)))
                futures.append(fut)
            jobs_of[k] = (specs, futures)
        builds = 0 if final else len(pkg.parts) * len(planned)
        pool = ThreadPoolExecutor(max_workers=build_jobs(settings, builds + len(after)), thread_name_prefix="build")
        if final:
            # Answered by the index: nothing compiled, nothing assembled.
            for job in after:
                pool.submit(job)
            for t, _, build_id in planned:
                o = _with_twin(reg, outcome_from_row(reg, build_id, t.ref, cached=True), False)
                progress("finished", t.ref, o.to_dict())
                report.outcomes.append(o)
            with interruptible():
                return _then_twin(settings, reg, PackageReport(report, []), planned, Path(export_dir), twin=twin,
                                  require=require_twin, progress=progress, published=published, twins=jobs_of)
        listen = [part_progress(i) if part_progress else no_progress for i in range(len(pkg.parts))]
        with interruptible():
            parts = build_many(settings, list(pkg.parts), target_refs, option_pairs, progress=listen,
                               registry=reg, retry_failed=retry_failed, executors=executors, pool=pool, after=after)
        with reg.db.session() as s:
            for k, (_, _, build_id) in enumerate(planned):
                link_parts(s, build_id, [p.outcomes[k].build_id for p in parts])
        for k, (t, spec, build_id) in enumerate(planned):
            progress("assembling", t.ref, {"parts": len(parts)})
            start = time.perf_counter()
            ran = False
            while True:
                def hear(event: str, info: dict[str, Any], ref: str = t.ref) -> None:
                    progress(event, ref, info)

                ran = assemble(settings, reg, pkg, spec, build_id, [p.outcomes[k] for p in parts],
                               Path(export_dir), twin=twin, progress=hear) or ran
                with reg.db.session() as s:
                    if states.get_build(s, build_id).state in states.FINAL:
                        break
                # Another process assembles it: wait until it is done or its lease lapses.
                progress("waiting", t.ref, {"build_id": build_id})
                wait_until_final_or_free(reg, build_id)
            o = outcome_from_row(reg, build_id, t.ref, cached=not ran)
            o.wall_seconds = time.perf_counter() - start
            o.compile_seconds = sum(p.outcomes[k].compile_seconds or 0.0 for p in parts) or o.compile_seconds
            o = _with_twin(reg, o, False)
            progress("finished", t.ref, o.to_dict())
            report.outcomes.append(o)
        with interruptible():
            return _then_twin(settings, reg, PackageReport(report, parts), planned, Path(export_dir), twin=twin,
                              require=require_twin, progress=progress, published=published, twins=jobs_of)
    except BaseException as exc:
        stop.set(getattr(exc, "signum", 2))  # a twin build under way stops and gives its row back
        raise
    finally:
        if pool is not None:
            # Every twin this command checks is recorded by now: a twin build still running is one
            # no check waits for (its package failed): it stops and gives its row back.
            if not stop.is_set():
                stop.set(2)
            pool.shutdown(wait=True, cancel_futures=True)
        pkg.cleanup()
        reg.close()


def submit_package(settings: Settings, export_dir: str | Path, target_refs: Sequence[str], sdks: Sequence[str] = (),
                   option_pairs: Sequence[str] | Mapping[str, Any] = (), *, name: str | None = None,
                   tag: str | None = None, allow_queue: bool = False, retry_failed: bool = False,
                   force_tag: bool = False, registry: Any = None, app: Any = None,
                   served: dict[tuple[str, str], list[str]] | None = None, dispatch: bool = True,
                   owner: int | None = None, fleet: Any = None, warn: Callable[[str], None] | None = None) -> Any:
    """Cluster (``farm submit --genai``; ``POST /v1/genai`` runs it on the folder it laid out
    from the blobs it was sent): each part a group release (its builds sent to the workers of
    each toolchain: parts build on different workers at once, each admitted by its worker's
    memory planner); the package's builds queued on the same queues, linked to their parts, and
    sent when the last part is final (``after_part``, on the worker that finished it). One
    release holds the package's builds and every part's: status, progress per part, cancel
    (``farm cancel RELEASE``) and one answer. ``dispatch=False``: no broker, the caller runs the
    release's builds itself (the embedded service: ``EmbeddedRunner`` does the fan-in).
    ``owner``: the token that submitted it through the service (the package's release is its:
    its quota, its cancel). ``served``: the toolchains that build (default: the live workers').
    ``fleet``: what each toolchain's workers make (default: their announcements; the embedded
    service: this environment): an SDK that can't make the package is left out, parts and all,
    with one warning (``warn``, and the answer's ``warnings``), or refused when named with
    ``sdks`` (``capability-missing``); the package builds go to the genai queue of their SDK,
    which only workers that make them serve."""
    from sqlalchemy import select

    from farm.core.capabilities import genai_matrix
    from farm.core.options import parse_pairs
    from farm.pipeline import states
    from farm.pipeline.capabilities import fleet_here, fleet_of
    from farm.pipeline.plan import (
        _spec,
        _status,
        check_support,
        queue_release,
        record_snapshot,
        served_toolchains,
        store_snapshot,
    )
    from farm.pipeline.queues import COMPILE_TASK, TWIN_TASK, check_broker, genai_queue, send, shared_app
    from farm.pipeline.submission import ReleaseRequest
    from registry.index import Registry, release_builds
    from registry.models import Build, Release, ReleaseBuild

    own = registry is None
    reg = registry or Registry.open(settings)
    pkg: PackageBundle | None = None
    try:
        options = dict(option_pairs) if isinstance(option_pairs, Mapping) else parse_pairs(option_pairs)
        request = ReleaseRequest.parse(target_refs, sdks, options, name, tag, allow_queue, retry_failed, force_tag)
        served = served if served is not None else served_toolchains(settings, reg)
        fan = genai_matrix([t.backend for t in request.targets], request.sdks, list(served),
                           fleet if fleet is not None else fleet_of(settings, reg) if dispatch else fleet_here(served))
        request.check_served(served)
        matrix = [(t, v) for t, v in request.matrix(served) if v in fan.versions.get(t.backend, ())]
        check_support(matrix, group=True, llm=True)
        warning = fan.warning()
        if warning and warn is not None:
            warn(warning)
        pkg = inspect_package(settings, export_dir, display=request.name)
        if dispatch:
            app = app or shared_app(settings)
            check_broker(app)
        # Parts first: each one release of its own group (recorded, stored, sent).
        # The parts build for exactly the package's SDKs: none for an SDK left out.
        part_sdks = list(sdks) or sorted({v for _, v in matrix})
        part_request = ReleaseRequest.parse(target_refs, part_sdks, options, None, None, allow_queue, retry_failed)
        part_releases: list[int] = []
        for g in pkg.parts:
            def store(g: Any = g) -> list[dict[str, Any]]:
                return store_snapshot(reg, g)

            part_releases.append(queue_release(settings, reg, g.digest, part_request, served=served, app=app,
                                               store=store, display=g.stem, onnx_digest=g.onnx.digest, size=g.size,
                                               dispatch=dispatch).release_id)
        files = store_snapshot(reg, cast(Any, pkg))  # a snapshot like a model's (digest, sources)
        to_send: list[tuple[int, str]] = []
        twins_to_send: list[tuple[int, str]] = []
        with reg.db.session() as s:
            moved = record_snapshot(s, pkg.digest, pkg.onnx.digest, pkg.size, files, request.name, request.tag,
                                    pkg.stem, force_tag=request.force_tag)
            label = f"{request.name}:{request.tag}" if request.name else pkg.stem[:255]
            release = Release(model_digest=pkg.digest, label=label, owner_token_id=owner,
                              matrix={"targets": [t.ref for t, _ in matrix], "toolchains": [v for _, v in matrix],
                                      "options": request.raw_options, "genai": True,
                                      # Made for this package only: cancelled with it (farm.pipeline.cancel).
                                      "part_releases": part_releases})
            s.add(release)
            s.flush()
            for t, version in matrix:
                spec = _spec(pkg.digest, t, version, request.options[t])
                queue = genai_queue(t.backend, version)
                build_id, _ = states.enqueue(s, spec, queue, retry_failed=request.retry_failed)
                # Each part's build of this (target, toolchain, options): by its key, as queued above.
                parts = [int(s.scalar(select(Build.id).where(
                    Build.build_key == _spec(g.digest, t, version, part_request.options[t]).build_key)) or 0)
                    for g in pkg.parts]
                link_parts(s, build_id, parts)
                for b in (build_id, *parts):
                    s.merge(ReleaseBuild(release_id=release.id, build_id=b))
                pb = s.get(Build, build_id)
                if dispatch and pb is not None and pb.state == states.BuildState.SUCCEEDED:
                    reopen_cancelled_twin(s, build_id)  # cancelled with an earlier release: due again
                if dispatch and pb is not None and pb.state == states.BuildState.QUEUED and all(
                        states.get_build(s, p).state in states.FINAL for p in parts):
                    to_send.append((build_id, queue))
                elif dispatch and pb is not None and pb.state == states.BuildState.SUCCEEDED and twin_orphaned(
                        settings, s, build_id):
                    to_send.append((build_id, queue))  # its twin was left pending: a worker runs it
                if pb is not None and pb.state != states.BuildState.FAILED and twin_wanted(s, build_id):
                    # Each part's twin build, sent now (they need nothing of the package): the
                    # genai workers take them after the builds of their compile queue.
                    specs = [twin_spec(g.digest, t.backend, t.name, version, part_request.options[t])
                             for g in pkg.parts]
                    twins_to_send += [(i, queue) for i, queued in enqueue_twins(s, specs, queue) if queued]
            release_id = release.id
        for build_id, queue in to_send:  # every part answered already (cached): assemble now
            send(app, COMPILE_TASK, [build_id], queue)
        if dispatch:
            for twin_id, queue in twins_to_send:
                send(app, TWIN_TASK, [twin_id], queue)
        with reg.db.session() as s:
            out = _status(s, release_id, release_builds(s, release_id), reg.store)
        out.tag_moved = moved
        out.warnings = [warning] if warning else []
        return out
    finally:
        if pkg is not None:
            pkg.cleanup()
        if own:
            reg.close()


def after_part(settings: Settings, reg: Any, build_id: int, app: Any) -> list[tuple[int, str]]:
    """A worker, after a build's final outcome: send each package build whose last part this
    was (to its toolchain's queue: any worker of it assembles). Returns (id, queue) of each sent."""
    from farm.pipeline.queues import COMPILE_TASK, send

    with reg.db.session() as s:
        ready = ready_packages(s, build_id)
    for pkg_id, queue in ready:
        send(app, COMPILE_TASK, [pkg_id], queue)
    return ready


def execute_package(executor: Any, build_id: int) -> Any:
    """``Executor.execute`` of a package build (None: ``build_id`` is not one): nothing to
    compile; with every part final, the package is assembled from the parts' artifacts here,
    its export laid out again from the stored snapshots (the config generator and the twin read
    it), and published; then this worker runs the twin and records it (the release already
    sees the package final). A part not final yet: ``waiting`` (the row stays queued,
    unclaimed; the last part's worker sends it again)."""
    from farm.pipeline import states
    from farm.pipeline.execute import Result
    from farm.pipeline.plan import outcome_from_row

    reg, settings = executor.registry, executor.settings
    with reg.db.session() as s:
        parts = states.part_builds(s, build_id)
        if parts is None:
            return None
        b = states.get_build(s, build_id)
        orphaned = b.state == states.BuildState.SUCCEEDED and twin_orphaned(settings, s, build_id)
        if b.state in states.FINAL and not orphaned:
            return Result("done", build_id)
        if not all(states.get_build(s, p).state in states.FINAL for p in parts):
            return Result("waiting", build_id)
        spec = states.BuildSpec(b.build_key, b.model_digest, b.backend, b.target, b.toolchain, dict(b.options),
                                b.options_digest)
        from registry.models import Model

        model = s.get(Model, b.model_digest)
        files = [dict(f) for f in (model.files if model else [])]
        b_queue = b.queue
    if orphaned:
        if _capability_refusal(spec) is not None:
            return Result("done", build_id)
        # Published, its twin left pending by a worker that died during it: run it here.
        with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-export-") as tmp:
            try:
                pkg = package_from_snapshot(settings, reg, files, Path(tmp) / "export")
            except FarmError:
                log.warning("build %s: its export could not be laid out again for its twin", build_id, exc_info=True)
                return Result("done", build_id)
            with reg.db.session() as s:
                from registry.index import artifact_for_build

                art = artifact_for_build(s, build_id)
                art_digest = art.digest if art is not None else None
            if art_digest:
                twin_after(executor, build_id, b_queue, spec, pkg.export.root, art_digest)
        return Result("done", build_id)
    refusal = _capability_refusal(spec)
    if refusal is not None:  # a release routes around it; this is a queue served by mistake
        with reg.db.session() as s:
            c = states.claim(s, build_id, owner=executor.owner, lease_seconds=settings.lease_seconds,
                             max_attempts=settings.max_attempts)
        if c.lease is not None:
            _fail(reg, c.lease, refusal.code, refusal.message)
        return Result("failed", build_id)
    outcomes = [outcome_from_row(reg, p, f"{spec.backend}:{spec.target}", cached=False) for p in parts]
    with tempfile.TemporaryDirectory(prefix="ctxfarm-genai-export-") as tmp:
        try:
            # Without the parts' weights: the assembly reads none; the twin lays them out after.
            pkg = package_from_snapshot(settings, reg, files, Path(tmp) / "export", weights=False)
        except FarmError as exc:
            with reg.db.session() as s:
                c = states.claim(s, build_id, owner=executor.owner, lease_seconds=settings.lease_seconds,
                                 max_attempts=settings.max_attempts)
            if c.lease is not None:
                _fail(reg, c.lease, exc.code, f"the package's export could not be laid out again: {exc.message}")
            return Result("failed", build_id)
        executor.events.publish(build_id, states.BuildState.RUNNING.value)
        ran = assemble(settings, reg, pkg, spec, build_id, outcomes, pkg.export.root, owner=executor.owner)
        with reg.db.session() as s:
            final = states.get_build(s, build_id)
            state = str(final.state)
            from registry.index import artifact_for_build

            art = artifact_for_build(s, build_id)
            art_digest = art.digest if art is not None else None
        executor.events.publish(build_id, state)
        if ran and art_digest and twin_status(_description(reg, art_digest)) == "pending":
            # The release answered at publication (the row is final); this worker records the
            # twin right after, on the export laid out again with its weights.
            try:
                full = package_from_snapshot(settings, reg, files, Path(tmp) / "weights" / "export")
            except FarmError as exc:
                why = f"{exc.code}: the export could not be laid out for the twin: {exc.message[:500]}"
                record_twin(reg, art_digest, {"status": "unverified", "detail": why})
            else:
                twin_after(executor, build_id, b_queue, spec, full.export.root, art_digest)
    if not ran:
        return Result("busy", build_id)
    return Result("succeeded" if state == states.BuildState.SUCCEEDED else "failed", build_id,
                  artifact_id=art.id if art is not None else None)


def _capability_refusal(spec: Any) -> FarmError | None:
    """``capability-missing`` when this environment can't assemble the package (no usable
    onnxruntime-genai for its folder check): a deterministic failure, answered again from the
    index until ``--retry-failed``, not a toolchain-error found after the checks started."""
    from farm.core.capabilities import check_here
    from workers.capabilities import here

    try:
        check_here(spec.backend, spec.toolchain, here(spec.backend))
    except FarmError as exc:
        return exc
    return None
