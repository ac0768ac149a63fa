"""The accuracy check as a pipeline step (docs/evidence.md): after publication, never inside it.

``evaluate`` takes an artifact id, returns early when its figures exist (or a byte-identical
context's can be reused), else fetches the model snapshot and the artifact into a fresh temp dir
and runs ``workers.backends.check_accuracy`` (a child under ``FARM_ACCURACY_BUDGET``), and
records the result. It runs where the answer does not wait for it: embedded ``farm build`` only
when asked (``--min-psnr``/``--accuracy``), a worker as a follow-up task on the probe queue, the
embedded service on a background thread. A check no answer waits for (an ungated release: the
build is ``succeeded`` and published before it starts) runs at ``SCHED_IDLE``, one at a time, so
it never takes a core from the next build; a ``--min-psnr`` release's check runs at once, at
nice 10, since its answer waits for the figures.

``gate_outcomes`` is ``--min-psnr`` on an embedded answer: a build whose worst output is below
the threshold fails with ``accuracy-below-threshold`` naming it; its artifact stays published.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.core.errors import FarmError, UsageError
from farm.core.settings import Settings
from registry.index import Registry

log = logging.getLogger("ctxfarm.accuracy")

MAX_PSNR_GATE = 200.0


def check_min_psnr(value: float | None) -> float | None:
    """A ``--min-psnr`` value: a finite number of dB in [0, 200]."""
    import math

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= MAX_PSNR_GATE:
        raise UsageError(f"--min-psnr {value!r} is not a number of dB from 0 to {MAX_PSNR_GATE:g}",
                         hint="e.g. --min-psnr 30 (fp16 rounding of a well-scaled model gives 60-80 dB)")
    return float(value)


def runtime_version(backend: str) -> str | None:
    """The toolchain version this environment runs accuracy checks under (None: none here)."""
    if backend != "qnn":
        return None
    from workers.backends import qnn_toolchain

    try:
        return qnn_toolchain().version
    except FarmError:
        return None


def evaluate(settings: Settings, reg: Registry, artifact_id: int, *, force: bool = False,
             seed: int = 0, dims: dict[str, int] | None = None, idle: bool = False,
             cancel: Any = None) -> dict[str, Any] | None:
    """Run (or reuse) the accuracy check of one artifact under this environment's runtime and
    record it; returns its view (``registry.evidence.view``), None for an unknown artifact.
    ``idle``: no answer waits for it, so its run takes only CPU time nothing else wants.
    ``cancel`` (an ``is_set()`` flag): the run is stopped once it is set, ``LeaseLostError``
    raised and nothing recorded."""
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    from farm.core.catalog import load_catalog
    from registry import evidence
    from registry.install import download_artifact
    from registry.models import Artifact, Model, ModelSample

    with reg.db.session() as s:
        art = s.scalar(select(Artifact).options(selectinload(Artifact.files)).where(Artifact.id == artifact_id))
        if art is None:
            return None
        backend = art.backend
        runtime = runtime_version(backend)
        sample = s.get(ModelSample, art.model_digest)
        inputs = sample.digest if sample is not None else evidence.SEEDED if not dims and seed == 0 else \
            f"seeded:{seed}:" + ",".join(f"{k}={v}" for k, v in sorted((dims or {}).items()))
        inputs = inputs[:80]
        label = runtime or "none"
        contexts = [f.digest for f in art.files if f.role in ("ctx-model", "context")]
        key = evidence.numerics_key(art.model_digest, contexts, backend, label, inputs)
        if not force:
            have = evidence.existing(s, art.id, backend, label, inputs)
            if have is not None:
                return evidence.view(have)
            reuse = evidence.reusable(s, key, art.id)
            if reuse is not None:
                reused = {"status": reuse.status, "outputs": reuse.outputs, "run_seconds": reuse.run_seconds,
                          "reference_seconds": reuse.reference_seconds,
                          "detail": f"reused: the same model, context bytes, runtime and inputs were checked "
                                    f"as artifact id {reuse.artifact_id}" + (f"; {reuse.detail}" if reuse.detail
                                                                            else "")}
                return evidence.view(evidence.record(s, art.id, backend, label, inputs, key, reused))
        model = s.get(Model, art.model_digest)
        files = [dict(f) for f in (model.files if model else [])]
        sample_digest = sample.digest if sample is not None else None
        # The CPU reference of the samples, kept once per model for device agents (docs/device-lab.md).
        keep = sample_digest is not None and evidence.wants_reference(s, art.model_digest, sample_digest)
        s.expunge_all()
    if runtime is None:
        result: dict[str, Any] = {"status": "unverified", "outputs": [],
                                  "detail": f"no {backend} runtime in this environment can run the artifact"}
    elif _newer(art.toolchain, runtime):
        result = {"status": "unverified", "outputs": [],
                  "detail": f"built with {backend.upper()} {art.toolchain}, newer than the runtime here ({runtime})"}
    else:
        result = _run(settings, reg, art, files, sample_digest, seed, dims, load_catalog, download_artifact, idle,
                      cancel, keep_reference=keep)
    with reg.db.session() as s:
        row = evidence.record(s, artifact_id, backend, label, inputs, key, result)
        out = evidence.view(row)
    log.info("accuracy of artifact %s under %s %s: %s", artifact_id, backend, label, evidence.headline([out]))
    return out


def _newer(built: str, runtime: str) -> bool:
    from farm.core.keys import parse_version

    return bool(parse_version(built) > parse_version(runtime))


def _run(settings: Settings, reg: Registry, art: Any, files: list[dict[str, Any]], sample_digest: str | None,
         seed: int, dims: dict[str, int] | None, load_catalog: Any, download_artifact: Any,
         idle: bool = False, cancel: Any = None, keep_reference: bool = False) -> dict[str, Any]:
    from farm.pipeline.bundles import download_bundle
    from workers.backends import check_accuracy

    socs = art.target.split("+")
    if len(socs) > 1:
        # A multi-SoC context: the simulator refuses it for each of its SoCs (measured:
        # QNN_CONTEXT_ERROR_CREATE_FROM_BINARY); only devices can say.
        return {"status": "unverified", "outputs": [],
                "detail": f"a multi-SoC context ({', '.join(socs)}): no runtime here can load it; devices verify it"}
    target = load_catalog().get(art.target, backend=art.backend)
    with tempfile.TemporaryDirectory(prefix="ctxfarm-accuracy-") as tmp:
        root = Path(tmp)
        try:
            model_path = download_bundle(reg.store, files, root / "model")
            ctx = download_artifact(reg.store, art, root / "artifact")
            sample = None
            if sample_digest is not None:
                from registry.store.base import download

                sample = root / "sample.npz"  # fixed name: never one from outside
                download(reg.store, sample_digest, sample)
        except FarmError as exc:
            return {"status": "unverified", "outputs": [], "detail": f"{exc.code}: {exc.message[:1000]}"}
        except (KeyError, IndexError, TypeError, ValueError) as exc:  # a bundle laid out otherwise (a group)
            return {"status": "unverified", "outputs": [],
                    "detail": f"the model or artifact could not be laid out for a check: {type(exc).__name__}: {exc}"}
        (root / "work").mkdir()
        reference = root / "reference.npz" if keep_reference and sample_digest is not None else None
        result = check_accuracy(model_path, ctx, target, root / "work", budget=settings.accuracy_budget,
                                memory_mb=settings.compile_memory_mb, seed=seed, dims=dims, sample=sample,
                                idle=idle, cancel=cancel, reference_out=reference,
                                reference_max=settings.reference_max_bytes)
        kept = result.pop("reference", None)
        if reference is not None and sample_digest is not None and isinstance(kept, dict):
            _keep_reference(reg, art.model_digest, sample_digest, reference, kept)
        return result


def _keep_reference(reg: Registry, model_digest: str, sample_digest: str, path: Path, kept: dict[str, Any]) -> None:
    """Store the reference ``.npz`` the check kept (a content-addressed blob, like the samples) and
    record it with the samples, or record why none was kept."""
    from registry import evidence

    digest = size = None
    if kept.get("kept") and path.is_file():
        from registry.store.base import put_file

        info = put_file(reg.store, path)
        digest, size = info.digest, info.size
    with reg.db.session() as s:
        evidence.record_reference(s, model_digest, sample_digest, digest, size, kept.get("why"))
    log.info("CPU reference of %s's samples: %s", model_digest[:19],
             f"kept as {digest} ({size} bytes)" if digest else f"not kept: {kept.get('why')}")


def gate_outcomes(settings: Settings, reg: Registry, outcomes: Sequence[Any], min_psnr: float | None,
                  progress: Any = None) -> None:
    """Embedded: check every built or cached outcome (``BuildOutcome``) and, with ``min_psnr``,
    fail those below it. Sets ``outcome.accuracy`` (the view) on each checked outcome."""
    from registry import evidence
    from registry.index import find_artifact

    for o in outcomes:
        if o.state == "failed" or not o.artifact or not o.target.startswith("qnn:"):
            continue
        with reg.db.session() as s:
            artifact_id = find_artifact(s, o.artifact).id
        if progress is not None:
            progress("checking", o.target, {"what": "accuracy"})
        t = time.perf_counter()
        o.accuracy = evaluate(settings, reg, artifact_id)
        if o.accuracy is not None:
            o.accuracy["wall_seconds"] = round(time.perf_counter() - t, 3)
        if min_psnr is None:
            continue
        refusal = evidence.gate(o.accuracy, min_psnr, o.artifact)
        if refusal is not None:
            o.cached_failure = False
            o.state, o.error_code, o.error_message = "failed", refusal.code, refusal.message


# ---- cluster: a follow-up task, and the gate on a release's answer ---------------------------------

ACCURACY_TASK = "ctxfarm.check_accuracy"  # workers.tasks.check_accuracy, sent to the probe queue


def gated_release(s: Any, build_id: int) -> bool:
    """Whether a release holding this build asked for --min-psnr."""
    from sqlalchemy import select

    from registry.models import Release, ReleaseBuild

    # The newest releases only: a build answered from the index joins a release per re-submission.
    matrices = s.scalars(select(Release.matrix).join(ReleaseBuild, ReleaseBuild.release_id == Release.id)
                         .where(ReleaseBuild.build_id == build_id).order_by(Release.id.desc()).limit(50))
    return any((m or {}).get("min_psnr") is not None for m in matrices)


def after_publish(settings: Settings, reg: Registry, build_id: int, artifact_id: int) -> bool:
    """A worker, after a publication: send the check when FARM_ACCURACY=after or a gated release
    waits for it. The answer does not wait: the build is already ``succeeded``."""
    if settings.accuracy == "off":
        return False
    if settings.accuracy != "after":
        with reg.db.session() as s:
            if not gated_release(s, build_id):
                return False
    return bool(schedule(settings, reg, [artifact_id]))


def schedule(settings: Settings, reg: Registry, artifact_ids: list[int]) -> list[int]:
    """Send the check of each artifact that has no figures yet to its toolchain's probe queue
    (after the caller's commit). Without a broker (embedded service) it runs in a thread here."""
    from sqlalchemy import select

    from registry.models import AccuracyResult, Artifact

    if not artifact_ids or settings.accuracy == "off":
        return []
    with reg.db.session() as s:
        done = set(s.scalars(select(AccuracyResult.artifact_id).where(AccuracyResult.artifact_id.in_(artifact_ids))))
        todo = [(a.id, a.backend, a.toolchain) for a in s.scalars(select(Artifact).where(Artifact.id.in_(artifact_ids)))
                if a.id not in done]
    if not todo:
        return []
    if not settings.broker_url:
        # In this process: a gated release's checks at once (its answer waits for them), the rest
        # one at a time on the background checker, at idle priority.
        with reg.db.session() as s:
            gated = {a for a, _b, _t in todo if _gated_artifact(s, a)}
        now = [a for a, _b, _t in todo if a in gated]
        later = [a for a, _b, _t in todo if a not in gated]
        if now:
            import threading

            threading.Thread(target=_run_all, args=(settings, reg, now, False), name="accuracy", daemon=True).start()
        for artifact_id in later:
            _background().put((settings, reg, artifact_id))
        return [a for a, _b, _t in todo]
    from farm.pipeline.queues import probe_queue, send, shared_app

    app = shared_app(settings)
    for artifact_id, backend, toolchain in todo:
        send(app, ACCURACY_TASK, [artifact_id], probe_queue(backend, toolchain))
    return [a for a, _b, _t in todo]


def _gated_artifact(s: Any, artifact_id: int) -> bool:
    """Whether a --min-psnr release waits for this artifact's check."""
    from registry.models import Artifact

    art = s.get(Artifact, artifact_id)
    return art is not None and gated_release(s, art.build_id)


def _run_all(settings: Settings, reg: Registry, artifact_ids: list[int], idle: bool) -> None:
    for artifact_id in artifact_ids:
        try:
            run_task(settings, reg, artifact_id, idle=idle)
        except Exception:  # recorded nowhere else: the log says why
            log.exception("accuracy check of artifact %s failed", artifact_id)


class BackgroundChecks:
    """The checks no answer waits for, in this process (the embedded farm): one at a time, in
    order, on one daemon thread started by the first (several at once would take every core the
    next build's compile wants). ``idle()`` says whether nothing is queued or running.

    A check starts only once no build of this process has been in flight for ``QUIET_SETTLE_S``
    (a release script's next submission comes within that), and a build that starts while it runs
    stops it (its child is killed within ``workers.host.CANCEL_POLL``): it waits and starts over.
    SCHED_IDLE alone yields CPU time, not the memory bandwidth, caches and child start a check
    takes from the compile beside it (a third slower next build on this 2-core box). A check held
    back ``HOLD_MAX_S`` in all (a farm never quiet) runs to its end whatever starts."""

    def __init__(self) -> None:
        import queue
        import threading

        self.jobs: queue.Queue[tuple[Settings, Registry, int]] = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.busy = 0
        self.preempted = 0  # checks stopped by a build and started over (tests, benches)

    def put(self, job: tuple[Settings, Registry, int]) -> None:
        import threading

        with self.lock:
            self.busy += 1
            self.jobs.put(job)
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name="accuracy-background", daemon=True)
                self.thread.start()

    def _loop(self) -> None:
        while True:
            settings, reg, artifact_id = self.jobs.get()
            try:
                self._check(settings, reg, artifact_id)
            finally:
                with self.lock:
                    self.busy -= 1

    def _check(self, settings: Settings, reg: Registry, artifact_id: int) -> None:
        from farm.core.errors import LeaseLostError

        held_until = time.monotonic() + HOLD_MAX_S
        while True:
            left = held_until - time.monotonic()
            quiet = left > 0 and _quiet.wait(left, QUIET_SETTLE_S)
            try:
                run_task(settings, reg, artifact_id, idle=True, cancel=_quiet if quiet else None)
                return
            except LeaseLostError:
                with self.lock:
                    self.preempted += 1
                log.info("accuracy check of artifact %s stopped by a build; it starts again when none runs",
                         artifact_id)
            except Exception:  # recorded nowhere else: the log says why
                log.exception("accuracy check of artifact %s failed", artifact_id)
                return

    def idle(self) -> bool:
        with self.lock:
            return self.busy == 0


HOLD_MAX_S = 600.0  # a check waits (and is stopped) at most this long in all (a farm never idle still checks)
QUIET_SETTLE_S = 2.0  # and starts only after this long with no build in flight


class _Quiet:
    """Whether this process compiles: builds in flight counted by the embedded runner. Its
    ``is_set()`` (a cancel flag for a background check) says a build is in flight now."""

    def __init__(self) -> None:
        import threading

        self.cond = threading.Condition()
        self.n = 0
        self.changed = time.monotonic()

    def add(self, k: int) -> None:
        with self.cond:
            self.n = max(self.n + k, 0)
            self.changed = time.monotonic()
            self.cond.notify_all()

    def is_set(self) -> bool:
        return self.n > 0

    def wait(self, timeout: float, settle: float = 0.0) -> bool:
        """Until no build has been in flight for ``settle`` s (True), or ``timeout`` (False)."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                now = time.monotonic()
                if self.n == 0 and now - self.changed >= settle:
                    return True
                if now >= end:
                    return False
                self.cond.wait(min(end, self.changed + settle) - now if self.n == 0 else end - now)


_quiet = _Quiet()


def compiling(k: int) -> None:
    """``k`` more (or, negative, fewer) builds in flight in this process: background checks wait
    until none has been for ``QUIET_SETTLE_S``, and one running is stopped (at most
    ``HOLD_MAX_S`` in all)."""
    _quiet.add(k)


_BACKGROUND: BackgroundChecks | None = None


def _background() -> BackgroundChecks:
    global _BACKGROUND
    if _BACKGROUND is None:
        _BACKGROUND = BackgroundChecks()
    return _BACKGROUND


def background_idle() -> bool:
    """Whether this process has no background check queued or running (benches wait on it)."""
    return _BACKGROUND is None or _BACKGROUND.idle()


def run_task(settings: Settings, reg: Registry, artifact_id: int, *, idle: bool | None = None,
             cancel: Any = None) -> str | None:
    """The task body: evaluate, then wake whoever waits on the artifact's build (its release's
    long poll re-reads the gate). ``idle`` (None: unless a --min-psnr release waits for it): the
    check runs at idle priority."""
    from registry.models import Artifact

    if idle is None:
        with reg.db.session() as s:
            idle = not _gated_artifact(s, artifact_id)
    out = evaluate(settings, reg, artifact_id, idle=idle, cancel=cancel)
    if out is None:
        return None
    with reg.db.session() as s:
        art = s.get(Artifact, artifact_id)
        build_id = art.build_id if art is not None else None
    if build_id is not None:
        try:
            from farm.pipeline.events import Publisher

            Publisher(settings.broker_url).publish(build_id, "succeeded")
        except Exception:  # the waiters' poll is the fallback
            log.warning("could not announce the accuracy of build %s", build_id, exc_info=True)
    return str(out["status"])


def release_gate_view(s: Any, view: dict[str, Any], art: Any, min_psnr: float) -> dict[str, Any]:
    """A succeeded build of a --min-psnr release as that release sees it: still ``running`` (note
    ``accuracy check pending``) until the check has run, then failed with the gate's code when an
    output is below the threshold (or no figure could be had), else as it is."""
    from registry import evidence
    from registry.models import AccuracyResult

    if view["state"] != "succeeded" or art is None:
        return view
    from sqlalchemy import select

    row = s.scalar(select(AccuracyResult).where(AccuracyResult.artifact_id == art.id)
                   .order_by(AccuracyResult.recorded_at.desc()).limit(1))
    if row is None:
        return {**view, "state": "running", "note": "built; accuracy check pending"}
    refusal = evidence.gate(evidence.view(row), min_psnr, art.digest)
    if refusal is None:
        return {**view, "note": f"accuracy {evidence.headline([evidence.view(row)])} >= {min_psnr:g} dB"}
    return {**view, "state": "failed", "error_code": refusal.code, "error_message": refusal.message,
            "note": f"built and published; this release requires --min-psnr {min_psnr:g}"}
