"""What every worker does around a runner: claim the build row, keep its lease alive, fetch the
model bundle, compile, publish, record; probe artifacts built by other toolchains; register and
heartbeat. The Celery tasks in ``workers.tasks`` are thin wrappers over these functions.

No onnxruntime here: runners compile in child processes.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from farm.config import Settings
from farm.errors import DETERMINISTIC_FAILURES, FarmError, StorageError

log = logging.getLogger("ctxfarm.worker")


@dataclass
class WorkerContext:
    """Per-process state of a worker (SQL engines must not cross a fork: built lazily per pid)."""

    settings: Settings
    registry: Any
    runner: Any
    toolchain: Any
    owner: str
    worker_id: int | None = None

    @classmethod
    def create(cls, settings: Settings, backend: str) -> WorkerContext:
        from registry.index import Registry
        from workers.runner import get_runner

        runner = get_runner(backend)
        worker_id = os.environ.get("CTXFARM_WORKER_ID")
        name = os.environ.get("CTXFARM_WORKER_NAME") or f"{socket.gethostname()}:{os.getpid()}"
        return cls(settings, Registry.open(settings), runner, runner.toolchain(), f"{name}/{os.getpid()}",
                   int(worker_id) if worker_id else None)


class LeaseKeeper:
    """Renews the build row's lease every lease/3 seconds while the compile runs."""

    def __init__(self, ctx: WorkerContext, build_id: int):
        self.ctx, self.build_id = ctx, build_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{build_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from registry.index import renew_lease

        interval = max(self.ctx.settings.lease_seconds / 3, 0.5)
        while not self._stop.wait(interval):
            try:
                with self.ctx.registry.db.session() as s:
                    renew_lease(s, self.build_id, self.ctx.owner, self.ctx.settings.lease_seconds)
            except Exception:  # the DB blipping must not kill the compile; the next renewal retries
                log.warning("lease renewal for build %s failed", self.build_id, exc_info=True)


def fetch_bundle(store: Any, files: list[dict[str, Any]], dest: Path) -> Path:
    """Download a stored model bundle (verified) into ``dest``; returns the .onnx path."""
    from registry.store.base import download

    if not all(f.get("stored") for f in files):
        raise StorageError("the model bundle was never uploaded to the store",
                           hint="submit it with `farm submit` (cluster mode uploads the bundle)")
    for f in files:
        download(store, f["digest"], dest / f["path"], size=int(f["size"]))
    return dest / files[0]["path"]


def backoff(attempt: int) -> float:
    return float(min(5 * 2 ** max(attempt - 1, 0), 300))


def compile_build(ctx: WorkerContext, build_id: int) -> tuple[str, float]:
    """Run one delivered build. Returns (outcome, retry countdown): outcome is ``done``,
    ``succeeded``, ``failed``, ``busy`` or ``retry`` (the last two want a redelivery)."""
    from farm.catalog import load_catalog
    from farm.submit import PlannedBuild, publish, signer_for
    from registry.index import fail_build, get_build, heartbeat, requeue_after_failure, start_build
    from registry.models import Model
    from workers.runner import CompileJob

    s_ = ctx.settings
    with ctx.registry.db.session() as s:
        decision = start_build(s, build_id, owner=ctx.owner, lease_seconds=s_.lease_seconds,
                               max_attempts=s_.max_attempts)
        b = get_build(s, build_id)
        s.refresh(b)  # the claim was a bulk UPDATE: read what it wrote (attempts = this attempt)
        row: dict[str, Any] = {"backend": b.backend, "target": b.target, "toolchain": b.toolchain, "options": b.options,
               "options_digest": b.options_digest, "build_key": b.build_key, "model": b.model_digest,
               "attempts": b.attempts}
        model = s.get(Model, b.model_digest)
        files = list(model.files) if model else []
        stem = model.first_name if model else "model"
    if decision == "busy":
        return "busy", s_.lease_seconds
    if decision != "run":
        return "done", 0.0
    if (row["backend"], row["toolchain"]) != (ctx.toolchain.backend, ctx.toolchain.version):
        with ctx.registry.db.session() as s:
            fail_build(s, build_id, "no-worker", f"misrouted: this worker serves {ctx.toolchain.backend} "
                       f"{ctx.toolchain.version}, the build needs {row['backend']} {row['toolchain']}", None)
        return "failed", 0.0
    gpu = os.environ.get("CTXFARM_GPU_TARGET")
    if row["backend"] == "trt" and gpu:
        from workers.trt.runner import serves

        if not serves(gpu, row["target"], row["options"]):
            with ctx.registry.db.session() as s:
                fail_build(s, build_id, "no-worker", f"misrouted: this worker's GPU is {gpu}, the build is for "
                           f"{row['target']}", None)
            return "failed", 0.0
    target = load_catalog().get(row["target"], backend=row["backend"])
    planned = PlannedBuild(target, ctx.toolchain, row["options"], row["options_digest"], row["build_key"])
    try:
        with LeaseKeeper(ctx, build_id), tempfile.TemporaryDirectory(prefix="ctxfarm-job-") as tmp:
            model_path = fetch_bundle(ctx.registry.store, files, Path(tmp) / "model")
            job = CompileJob(model_path, target, row["options"], stem, s_.compile_timeout, verify_load=True)
            out = ctx.runner.compile(job, Path(tmp) / "work")
            published = publish(ctx.registry, build_id, planned, row["model"], out, signer_for(s_))
            self_probe(ctx, published["artifact_id"], out.out_dir / out.ctx_model, target, out.self_load)
    except FarmError as exc:
        code = "storage-error" if isinstance(exc, StorageError) else exc.code
        text = exc.details.get("log")
        with ctx.registry.db.session() as s:
            if code in DETERMINISTIC_FAILURES or row["attempts"] >= s_.max_attempts:
                fail_build(s, build_id, code, exc.message, text)
                return "failed", 0.0
            requeue_after_failure(s, build_id, code, exc.message, text)
        return "retry", backoff(row["attempts"])
    with ctx.registry.db.session() as s:
        if ctx.worker_id:
            heartbeat(s, ctx.worker_id, jobs_done_delta=1)
    log.info("build %s published %s", build_id, published["digest"])
    schedule_probes(ctx, published["artifact_id"])
    return "succeeded", 0.0


def self_probe(ctx: WorkerContext, artifact_id: int, ctx_model: Path, target: Any,
               loaded: dict[str, Any] | None = None) -> str:
    """Load the fresh artifact under the toolchain that built it: evidence, not an assumption.
    ``loaded``: the compile child already did (runners that support verify_load)."""
    from registry.index import record_verdict

    if loaded is not None:
        verdict, detail = ("loads", None) if loaded.get("ok") else ("fails", str(loaded.get("error")))
    else:
        try:
            result = ctx.runner.load_check(ctx_model, target, timeout=ctx.settings.compile_timeout)
            verdict = "loads"
            detail = f"loaded; running it failed ({result['crashed']})" if result.get("crashed") else None
        except FarmError as exc:
            verdict, detail = "fails", exc.message[:2000]
    with ctx.registry.db.session() as s:
        record_verdict(s, artifact_id, ctx.toolchain.backend, ctx.toolchain.version, verdict, "probe", detail)
    return verdict


def schedule_probes(ctx: WorkerContext, artifact_id: int) -> list[str]:
    """Ask every other live toolchain of this backend to load the new artifact."""
    from farm.celery_app import PROBE_TASK, make_app, probe_queue, send
    from registry.index import live_workers

    if not ctx.settings.broker_url:
        return []
    with ctx.registry.db.session() as s:
        versions = sorted({w.toolchain for w in live_workers(s, stale_after=ctx.settings.worker_stale_after)
                           if w.backend == ctx.toolchain.backend and w.toolchain != ctx.toolchain.version})
    app = make_app(ctx.settings)
    for v in versions:
        send(app, PROBE_TASK, [artifact_id], probe_queue(ctx.toolchain.backend, v))
    return versions


def probe_artifact(ctx: WorkerContext, artifact_id: int) -> str | None:
    """Load an artifact under this worker's toolchain and record the verdict as evidence."""
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    from farm.catalog import load_catalog
    from farm.errors import CompileTimeoutError
    from farm.fetch import fetch_artifact
    from registry.index import record_verdict, verdicts_for
    from registry.models import Artifact

    tc = ctx.toolchain
    with ctx.registry.db.session() as s:
        if (artifact_id, tc.version) in verdicts_for(s, [artifact_id], tc.backend):
            return None
        art = s.scalar(select(Artifact).options(selectinload(Artifact.files)).where(Artifact.id == artifact_id))
        if art is None or art.backend != tc.backend:
            return None
        s.expunge_all()
    target = load_catalog().get(art.target, backend=art.backend)
    with tempfile.TemporaryDirectory(prefix="ctxfarm-probe-") as tmp:
        got = fetch_artifact(ctx.registry.store, art, Path(tmp))
        try:
            loaded = ctx.runner.load_check(got.ctx_model, target, timeout=ctx.settings.compile_timeout)
            verdict = "loads"
            detail = f"loaded; running it failed ({loaded['crashed']})" if loaded.get("crashed") else None
        except CompileTimeoutError:
            raise
        except FarmError as exc:
            verdict, detail = "fails", exc.message[:2000]
    with ctx.registry.db.session() as s:
        record_verdict(s, artifact_id, tc.backend, tc.version, verdict, "probe", detail)
    log.info("probe of artifact %s under %s %s: %s", artifact_id, tc.backend, tc.version, verdict)
    return verdict
