"""A genai part's twin build: the part's prefill and decode compiled alone (no weight sharing, the
quickest finalization, the build's other options), what the twin check runs on the simulator.

A build like any other: keyed (``twin_spec``: the part's group digest, the reference SoC of the
target's HTP arch, toolchain and options with the ``twin`` marker), so a re-submit, or the same
export for a second SoC of an arch compiled already, compiles no twin part again; queued, claimed
under a lease and moved by the guarded transitions of ``farm.pipeline.states``; admitted by the
memory planner. It lives in its own table (``registry.models.TwinBuild``): nothing that serves
devices reads it (no artifact row, no coverage cell, no tag, nothing to resolve or install); its
output is the compiled files as content-addressed blobs listed on the row (``output``), kept by
``registry gc``.

Publication wins: a twin build is admitted after any compile that waits (``MemoryGate.admit(low=
True)``), its child runs at ``workers.qnn.runner.TWIN_NICE``, the embedded pool takes it after the
part builds, and a worker runs the builds queued on its compile queue before a twin
(``workers.tasks.compile_twin``)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from farm.core.errors import (
    DETERMINISTIC_FAILURES,
    FarmError,
    Interrupted,
    LeaseLostError,
    NoWorkerError,
    UnknownTargetError,
)
from farm.core.keys import build_key, options_digest, sha256_file
from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.genai.bundle import PackageBundle
from farm.pipeline.genai.twin_record import twin_cancelled, twin_of, twin_pending, twin_status, twin_to_run

log = logging.getLogger("ctxfarm.genai")
TWIN_MARK = "twin"


def twin_options(options: dict[str, Any]) -> dict[str, Any]:
    """A part build's options as its twin compiles them: the build's own (the VTCM it asked for),
    the quickest finalization (mode 1: bit-identical outputs on the simulator, measured), the
    context in a ``.bin`` beside its model, and the marker that turns sharing off (and keeps the
    key apart from the shared part build's)."""
    return {**options, "graph_optimization": 1, "embed_mode": 0, TWIN_MARK: True}


def twin_spec(group_digest: str, backend: str, target: str, toolchain: str, options: dict[str, Any]) -> states.BuildSpec:
    """The twin build of the part group ``group_digest`` for the HTP arch of ``target``
    (toolchain, the part build's options): compiled for the arch's reference SoC
    (``Catalog.arch_reference``: SM8550 for every v73 SoC), which the row names as its target and
    its key holds, so the packages of two SoCs of one arch share their twin builds. The twin
    check loads a twin context as it was compiled (no ``soc_model`` at load). Measured
    (``bench/genai_twin_arch.py``, QNN 2.51.0, 2 parts of hidden 256 x 4 layers, and of 512 x 4
    with grouped-query attention): the twins compiled for SM8550, SC8380XP and QCS9100 differ in
    their bytes, but every output of each part's prefill and decode graph on the simulator was bit
    for bit the same, and so was the twin check on them (PSNR per output, the tokens, the largest
    logit error); an SM8450 (v69) twin's outputs were up to 0.004 apart, so the arch stays in the
    key. A multi-SoC target, or one the catalog no longer knows, keeps its name."""
    from farm.core.catalog import load_catalog

    try:
        catalog = load_catalog()
        target = catalog.arch_reference(catalog.get(target, backend=backend)).name
    except UnknownTargetError:
        pass  # compiled under its own name: its twin build fails there with this error's code
    opts = twin_options(options)
    od = options_digest(opts)
    return states.BuildSpec(build_key(group_digest, backend, target, toolchain, od), group_digest, backend, target,
                            toolchain, opts, od)


def enqueue_twins(s: Any, specs: Sequence[states.BuildSpec], queue: str | None) -> list[tuple[int, bool]]:
    """In the caller's transaction: each twin build queued (or found: the key dedupes). Returns
    (twin build id, whether this call queued work) per spec."""
    from registry.models import TwinBuild

    return [states.enqueue(s, spec, queue, table=TwinBuild) for spec in specs]


def twin_ids(reg: Any, specs: Sequence[states.BuildSpec]) -> list[int]:
    """The ids of these twin builds, by their keys (queued by whoever ran them); a spec never
    queued (its job did not start) is queued now, so the check says what became of it."""
    from sqlalchemy import select

    from registry.models import TwinBuild

    out = []
    with reg.db.session() as s:
        for spec in specs:
            found = s.scalar(select(TwinBuild.id).where(TwinBuild.build_key == spec.build_key))
            out.append(int(found) if found is not None else enqueue_twins(s, [spec], None)[0][0])
    return out


def package_twins(s: Any, package_build_id: int, queue: str | None = None) -> list[int] | None:
    """The twin builds of a package build's parts, in part order, queued where missing (a
    package queued by the embedded service, or before twin builds existed); None: not a package
    build."""
    parts = states.part_builds(s, package_build_id)
    if parts is None:
        return None
    specs = []
    for p in parts:
        b = states.get_build(s, p)
        specs.append(twin_spec(b.model_digest, b.backend, b.target, b.toolchain, dict(b.options)))
    return [i for i, _ in enqueue_twins(s, specs, queue)]


def execute_twin(executor: Any, twin_id: int, *, stop: Any = None) -> Any:
    """Claim and run one twin build on ``executor`` (its runner, memory gate, bundle cache):
    ``Result`` as ``Executor.execute`` answers (``succeeded``, ``failed``, ``retry``, ``done``,
    ``busy``, ``exhausted``, ``lost``). ``stop``: an Interruption that ends it (Ctrl-C)."""
    from farm.pipeline.execute import Result
    from registry.models import Model, TwinBuild

    reg, settings = executor.registry, executor.settings
    with reg.db.session() as s:
        c = states.claim(s, twin_id, owner=executor.owner, lease_seconds=settings.lease_seconds,
                         max_attempts=settings.max_attempts, table=TwinBuild)
        row = None
        if c.lease is not None:
            b = states.get_build(s, twin_id, TwinBuild)
            model = s.get(Model, b.model_digest)
            row = (b.backend, b.target, b.toolchain, dict(b.options), b.model_digest,
                   [dict(f) for f in (model.files if model else [])])
    if c.lease is None or row is None:
        return Result(c.action, twin_id)
    lease = c.lease
    try:
        return _run(executor, lease, row, stop)
    except BaseException as exc:
        # Ctrl-C, SIGTERM: the twin build goes back to queued at once, its attempt given back.
        reason = f"signal {exc.signum}" if isinstance(exc, Interrupted) else type(exc).__name__
        try:
            with reg.db.session() as s:
                states.release(s, lease, reason)
        except Exception:
            log.warning("could not release twin build %s after %s", twin_id, reason, exc_info=True)
        raise


def _run(executor: Any, lease: states.Lease, row: tuple[Any, ...], stop: Any) -> Any:
    from contextlib import ExitStack

    from farm.core.catalog import load_catalog
    from farm.pipeline.bundles import JOB_PREFIX
    from farm.pipeline.execute import LeaseKeeper, Phases, Result, _Either, _ms, fetch_bundle
    from workers.runner import CompileJob

    reg, settings = executor.registry, executor.settings
    backend, target_name, toolchain, options, digest, files = row
    ph = Phases()
    try:
        tc = executor.toolchain
        if (backend, toolchain) != (tc.backend, tc.version):
            raise NoWorkerError(f"misrouted: this executor serves {tc.backend} {tc.version}, the twin build needs "
                                f"{backend} {toolchain}")
        target = load_catalog().get(target_name, backend=backend)
        size = sum(int(f.get("size") or 0) for f in files)
        peaks = executor._peak_model(backend, toolchain)
        need_mb = peaks.predict_mb(size)
        what = f"twin build {lease.build_id} ({size / 2**30:.2f} GiB part)"
        executor.memory.check(need_mb, what)
        ph.ms["predicted_peak_mb"] = need_mb
        cap_mb = peaks.cap_mb(size, settings.compile_memory_mb) if settings.compile_memory_auto \
            else settings.compile_memory_mb
        with ExitStack() as stack:
            keeper = stack.enter_context(LeaseKeeper(reg, lease, settings.lease_seconds))
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{JOB_PREFIX}{os.getpid()}-"))
            cancel = _Either(*(f for f in (keeper.lost, stop, executor.interrupt) if f is not None))
            with ph.timed("bundle_fetch"):
                model_path, ph.ms["bundle_cache"] = fetch_bundle(reg, files, Path(tmp) / "model",
                                                                 cache=executor.bundles, model_digest=digest)
            job = CompileJob(model_path, target, options, settings.compile_timeout, cap_mb, verify_load=False,
                             cancel=cancel)
            waited = time.perf_counter()
            # After every compile that waits for room: the package's own go first.
            with executor.memory.admit(need_mb, what, stop=cancel, low=True):
                t = time.perf_counter()
                if t - waited >= 0.001:
                    ph.ms["memory_wait"] = _ms(t - waited)
                out = executor.runner.compile(job, Path(tmp) / "work")
            ph.compile(out, time.perf_counter() - t)
            keeper.check()
            _record(reg, lease, out, ph)
        return Result("succeeded", lease.build_id)
    except LeaseLostError:
        for flag in (stop, executor.interrupt):
            if flag is not None and flag.is_set():
                raise Interrupted(getattr(flag, "signum", 2) or 2) from None
        log.warning("twin build %s attempt %s: lease lost; nothing recorded", lease.build_id, lease.attempt)
        return Result("lost", lease.build_id)
    except FarmError as exc:
        return _failed(executor, lease, exc.code, exc.message, exc.details.get("log"), ph)
    except Exception as exc:  # a bug or an unexpected library error: bounded retries, then failed
        log.error("twin build %s: unexpected error", lease.build_id, exc_info=True)
        return _failed(executor, lease, "toolchain-error", f"unexpected {type(exc).__name__}: {exc}",
                       traceback.format_exc()[-8000:], ph)


def _record(reg: Any, lease: states.Lease, out: Any, ph: Any) -> None:
    """The compiled files uploaded (each verified by digest), then one transaction: the row's
    ``output`` and running -> succeeded (guarded: a late attempt records nothing)."""
    from sqlalchemy import update

    from farm.pipeline.execute import upload_blobs
    from registry.models import TwinBuild

    files, blobs = [], []
    with ph.timed("hash"):
        for f in out.files:
            digest, size = sha256_file(f.path)
            files.append({"name": f.name, "role": f.role, "digest": digest, "size": size, "mediaType": f.media_type})
            blobs.append((f.name, f.path, digest))
    with ph.timed("upload"):
        upload_blobs(reg.store, blobs)
    graphs = [{k: g.get(k) for k in ("name", "ctxModel", "contexts", "placement", "compileSeconds", "peakRssKib")}
              for g in out.graphs or []]
    output = {"files": files, "graphs": graphs, "compile_seconds": round(float(out.compile_seconds), 3),
              "toolchain": out.toolchain.to_dict()}
    with reg.db.session() as s:
        s.execute(update(TwinBuild).where(TwinBuild.id == lease.build_id, TwinBuild.lease_owner == lease.owner,
                                          TwinBuild.attempts == lease.attempt).values(output=output)
                  .execution_options(synchronize_session=False))
        states.succeed(s, lease, log=out.log, phases=ph.final())  # LeaseLostError rolls the output back too


def _failed(executor: Any, lease: states.Lease, code: str, message: str, text: str | None, ph: Any) -> Any:
    from farm.pipeline.execute import Result, backoff

    settings = executor.settings
    with executor.registry.db.session() as s:
        if code in DETERMINISTIC_FAILURES or code == "no-worker" or lease.attempt >= settings.max_attempts:
            ok = states.fail(s, lease, code, message[:4000], text, ph.final())
            return Result("failed" if ok else "lost", lease.build_id)
        delay = backoff(lease.attempt, settings.retry_backoff_seconds)
        ok = states.requeue(s, lease, code, message[:4000], text, delay=delay, phases=ph.final())
        return Result("retry" if ok else "lost", lease.build_id, countdown=delay)


def settle_twins(executor: Any, twin_ids: Sequence[int], *, deadline: float | None = None, stop: Any = None,
                 poll: float = 0.25) -> None:
    """Every twin build of ``twin_ids`` final, or ``deadline`` (monotonic) passed: each queued
    one (or one whose holder's lease lapsed) is run here, one another executor holds is waited
    for, a retry waits its backoff."""
    from registry.models import TwinBuild

    for twin_id in twin_ids:
        while deadline is None or time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise Interrupted(getattr(stop, "signum", 2) or 2)
            r = execute_twin(executor, twin_id, stop=stop)
            if r.outcome in ("succeeded", "failed", "done", "exhausted"):
                break
            if r.outcome == "retry":
                pause = r.countdown
            else:  # busy or lost: another executor holds it; wait until it ends or its lease lapses
                with executor.registry.db.session() as s:
                    b = states.get_build(s, twin_id, TwinBuild)
                    if b.state in states.FINAL:
                        break
                pause = poll
            if deadline is not None:
                pause = min(pause, max(deadline - time.monotonic(), 0.0))
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)


def collect_compiled(reg: Any, twin_ids: Sequence[int], export: Any, dest: Path) -> tuple[dict[str, str] | None, str]:
    """The twin builds' contexts laid out under ``dest`` (``part<i>/``, each context model with its
    ``.bin`` beside it), as ``{stage name: path}`` for the twin check; (None, why) when a part's
    twin build did not succeed. Names read back from the index are checked to stay in ``dest``."""
    from farm.core.names import inside
    from registry.models import TwinBuild
    from registry.store.base import download

    compiled: dict[str, str] = {}
    for i, twin_id in enumerate(twin_ids):
        with reg.db.session() as s:
            b = states.get_build(s, twin_id, TwinBuild)
            state, code, message, output = b.state, b.error_code, b.error_message, b.output
        if state != states.BuildState.SUCCEEDED or not output:
            why = (f"{code}: {(message or '')[:1000]}" if state == states.BuildState.FAILED
                   else f"still {state} when the twin's budget ran out")
            return None, f"part {i}'s twin build ({twin_id}) did not succeed: {why}"
        part_dir = inside(dest, f"part{i}")
        part_dir.mkdir(parents=True, exist_ok=True)
        for f in output.get("files") or []:
            download(reg.store, f["digest"], inside(part_dir, f["name"]), size=int(f["size"]))
        graphs = {g.get("name"): g for g in output.get("graphs") or []}
        part = export.parts[i]
        for kind, stage in (("prefill", part.prefill), ("decode", part.decode)):
            ctx = (graphs.get(kind) or {}).get("ctxModel")
            if not isinstance(ctx, str):
                return None, f"part {i}'s twin build ({twin_id}) names no {kind} context model"
            compiled[stage.name] = str(inside(part_dir, ctx))
    return compiled, ""


def twin_figures(reg: Any, twin_ids: Sequence[int]) -> dict[str, Any]:
    """What the twin builds did, for the twin's record: their ids, compile seconds and the SoC
    they were compiled for (``target``: the reference SoC of the package's HTP arch, which may
    be another SoC than the package's; absent when they name several)."""
    from registry.models import TwinBuild

    with reg.db.session() as s:
        rows = [states.get_build(s, i, TwinBuild) for i in twin_ids]
        out: dict[str, Any] = {
            "builds": [int(r.id) for r in rows],
            "compile_seconds": round(sum(float((r.output or {}).get("compile_seconds") or 0.0) for r in rows), 3)}
        targets = {str(r.target) for r in rows}
        if len(targets) == 1:
            out["target"] = targets.pop()
        return out


# ---- scheduling: which twin builds a package wants, and running them -------------------------------

def twins_wanted(reg: Any, pkg: PackageBundle, planned: Sequence[tuple[Any, Any, int]]) -> dict[int, list[Any]]:
    """Per target (its index in ``planned``) whose twin will run (its package not final yet, or
    published with its twin missing or pending): its parts' twin builds (their specs)."""
    from farm.pipeline import states
    from registry.index import artifact_for_build

    out: dict[int, list[Any]] = {}
    with reg.db.session() as s:
        for k, (t, spec, build_id) in enumerate(planned):
            b = states.get_build(s, build_id)
            if b.state == states.BuildState.FAILED:
                continue
            if b.state == states.BuildState.SUCCEEDED:
                art = artifact_for_build(s, build_id)
                if art is None or not (twin_status(art.description) is None or twin_to_run(art.description)):
                    continue
            out[k] = [twin_spec(g.digest, t.backend, t.name, spec.toolchain, spec.options) for g in pkg.parts]
    return out


def twin_job(executor: Any, spec: Any, stop: Any) -> int:
    """One part's twin build in the embedded pool: queued (or found by its key: compiled
    already, or another process's; its part's group is recorded by now), then final. Returns
    its id."""
    with executor.registry.db.session() as s:
        (twin_id, _), = enqueue_twins(s, [spec], None)
    settle_twins(executor, [twin_id], stop=stop)
    return twin_id


def pool_job(fut: Future[Any], run: Callable[[], Any]) -> Callable[[], None]:
    """``run`` as a pool job whose end (its result, or what it raised) lands in ``fut``."""
    def job() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - the twin check reads it off its build's row
            fut.set_exception(exc)
    return job


def twin_wanted(s: Any, build_id: int) -> bool:
    """Whether a package build's twin will run: not published yet, or published with its twin
    pending or cancelled (a published package whose twin is recorded needs no twin build)."""
    from farm.pipeline import states
    from registry.index import artifact_for_build

    b = states.get_build(s, build_id)
    if b.state != states.BuildState.SUCCEEDED:
        return True
    art = artifact_for_build(s, build_id)
    return art is not None and twin_to_run(art.description)


def reopen_cancelled_twin(s: Any, build_id: int) -> bool:
    """In the caller's transaction: a published package whose twin was cancelled with its
    release, submitted again, has its twin ``pending`` again and due at once (``twin_orphaned``:
    the submission sends the package's message, a worker runs the twin). A message of the
    cancelled release taken later finds the twin cancelled, not due, and runs nothing."""
    from registry.index import artifact_for_build

    art = artifact_for_build(s, build_id)
    tw = twin_of(art.description if art is not None else None)
    if art is None or tw is None or tw.get("cancelled") is not True:
        return False
    art.description = {**(art.description or {}), "twin": {**twin_pending(), "rerun": True}}
    return True


def twin_orphaned(settings: Settings, s: Any, build_id: int) -> bool:
    """A published package whose twin is ``pending`` for longer than a twin may take (the
    accuracy budget, and the lease for good measure): whoever ran it died; run it again. One
    made pending again by a new submission after a cancel (``reopen_cancelled_twin``): at once."""
    from datetime import UTC, datetime

    from registry.index import artifact_for_build

    art = artifact_for_build(s, build_id)
    tw = twin_of(art.description if art is not None else None)
    if tw is None or tw.get("status") != "pending":
        return False
    if tw.get("rerun") is True:
        return True
    try:
        since = datetime.fromisoformat(str(tw.get("since")))
    except ValueError:
        return True
    age = (datetime.now(UTC) - (since if since.tzinfo else since.replace(tzinfo=UTC))).total_seconds()
    return age > settings.accuracy_budget + settings.lease_seconds


# ---- cancel: the twin builds of a cancelled release's packages ----------------------------------

def cancel_twins(s: Any, package_build_ids: Sequence[int], reason: str) -> list[tuple[int, str, str]]:
    """In the caller's transaction, after the cancelled releases are marked: the twin builds of
    these package builds' parts that no live release waits on, cancelled (``states.cancel``: a
    running one's worker loses its lease and records nothing, a queued one's message finds its
    row final and is dropped); (twin build id, state read, ``cancelled`` | ``kept`` | the final
    state it reached meanwhile) for each one that was queued or running. A package build a live
    release still holds keeps its twin builds. The twin of a published package left ``pending``
    is recorded ``unverified`` and cancelled (``twin_cancelled``), not pending forever: a worker
    still checking it records its figures over that."""
    from registry.index import artifact_for_build
    from registry.models import TwinBuild

    out: list[tuple[int, str, str]] = []
    for pkg_id in package_build_ids:
        if _held(s, pkg_id):
            continue
        for twin_id in _twins_of(s, pkg_id):
            was = str(states.get_build(s, twin_id, TwinBuild).state)
            if was in states.FINAL:
                continue
            if _twin_needed(s, twin_id):
                out.append((twin_id, was, "kept"))
                continue
            out.append((twin_id, was, states.cancel(s, twin_id, reason, table=TwinBuild)))
        if states.get_build(s, pkg_id).state == states.BuildState.SUCCEEDED:
            art = artifact_for_build(s, pkg_id)
            if art is not None and twin_status(art.description) == "pending":
                art.description = {**(art.description or {}), "twin": twin_cancelled(reason)}
    return out


def _twins_of(s: Any, package_build_id: int) -> list[int]:
    """The twin builds of a package build's parts that exist (by their keys; none queued here)."""
    from sqlalchemy import select

    from registry.models import TwinBuild

    keys = []
    for p in states.part_builds(s, package_build_id) or []:
        b = states.get_build(s, p)
        keys.append(twin_spec(b.model_digest, b.backend, b.target, b.toolchain, dict(b.options)).build_key)
    if not keys:
        return []
    return [int(i) for i in s.scalars(select(TwinBuild.id).where(TwinBuild.build_key.in_(keys)).order_by(TwinBuild.id))]


def _held(s: Any, build_id: int) -> bool:
    """Whether a live (not cancelled) release holds this build."""
    from sqlalchemy import select

    from registry.models import Release, ReleaseBuild

    return s.scalar(select(Release.id).join(ReleaseBuild, ReleaseBuild.release_id == Release.id)
                    .where(ReleaseBuild.build_id == build_id, Release.cancelled_at.is_(None)).limit(1)) is not None


def _twin_needed(s: Any, twin_id: int) -> bool:
    """Whether a live release waits on this twin build: one holding a package build whose twin
    will run (``twin_wanted``) and one of whose parts' builds this is the twin of (the same part,
    toolchain and options, for any SoC of the twin's HTP arch: another package with that part,
    the same package submitted again, or for another SoC of the arch). The part builds are
    matched by the twin's key, not its target: the twin row names the arch's reference SoC."""
    from sqlalchemy import select

    from registry.models import Build, GenaiPart, TwinBuild

    tb = states.get_build(s, twin_id, TwinBuild)
    rows = s.execute(select(GenaiPart.package_build_id, Build).join(Build, Build.id == GenaiPart.part_build_id)
                     .where(Build.model_digest == tb.model_digest, Build.backend == tb.backend,
                            Build.toolchain == tb.toolchain)).all()
    for pkg_id, part in rows:
        if twin_spec(part.model_digest, part.backend, part.target, part.toolchain,
                     dict(part.options)).build_key != tb.build_key:
            continue
        if _held(s, int(pkg_id)) and twin_wanted(s, int(pkg_id)):
            return True
    return False
