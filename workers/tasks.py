"""Celery tasks, imported by workers only: a front door onto ``farm.pipeline.execute``.

Thin: an id in, the one executor does the work. A duplicate message that finds its build
running or finished is acknowledged and dropped (the reconciler re-sends builds whose executor
died); a retryable failure is sent again with its backoff as countdown.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from farm.core.settings import Settings
from farm.pipeline.queues import COMPILE_TASK, PACKAGE_TASK, PROBE_TASK, TWIN_TASK, make_app, send

settings = Settings.from_env()
app = make_app(settings)
log = logging.getLogger("ctxfarm.worker")

_executors: dict[int, Any] = {}
# Set while a build executes in this process: SIGTERM/SIGINT then interrupt it (workers.main).
executing = threading.Event()
# Graceful rollouts (infra/k8s): the preStop hook creates DRAIN_FILE (builds that arrive are sent
# back to their queue) and waits while BUSY_FILE exists (the running compile finishes).
DRAIN_FILE = os.environ.get("CTXFARM_DRAIN_FILE")
BUSY_FILE = os.environ.get("CTXFARM_BUSY_FILE")


def genai_queues() -> frozenset[str]:
    """The genai queues this worker serves (``workers.main``): a package whose last part it
    published is assembled here at once (``assemble_now``)."""
    return frozenset(q for q in (os.environ.get("CTXFARM_GENAI_QUEUES") or "").split(",") if q)


_assembling: set[int] = set()
_assembling_lock = threading.Lock()


def assemble_now(ex: Any, pkg_id: int, queue: str) -> None:
    """A package whose last part this worker just published, assembled and published here at
    once, on a thread of its own, beside whatever this worker takes next. Sent to the genai queue
    only, it would wait behind the twin builds queued there at submit until some worker is free
    (measured at the default LLM size: 27 s, both workers compiling twin parts): publication wins.
    Its message stays in the broker until this run takes it off: a worker that gets it first
    finds the build held (``busy``) or final and drops it; if this worker dies, the lease lapses
    and the reconciler sends it again. The twin follows on the same thread, as on any worker."""
    with _assembling_lock:
        if pkg_id in _assembling:
            return
        _assembling.add(pkg_id)

    def run() -> None:
        from farm.pipeline.genai import execute_package

        try:
            result = execute_package(ex, pkg_id)
            if result is not None and result.outcome in ("succeeded", "failed", "exhausted"):
                _finish(ex, queue, result, taken=True)
        except Exception:
            log.warning("package build %s: assembling it on this worker raised; its message stays queued", pkg_id,
                        exc_info=True)
        finally:
            with _assembling_lock:
                _assembling.discard(pkg_id)

    threading.Thread(target=run, name=f"assemble-{pkg_id}", daemon=True).start()


def _busy(on: bool) -> None:
    if not BUSY_FILE:
        return
    if on:
        open(BUSY_FILE, "w").close()
    else:
        try:
            os.unlink(BUSY_FILE)
        except FileNotFoundError:
            pass


def executor() -> Any:
    """This process's Executor (pool children each build their own after the fork)."""
    from farm.pipeline.execute import Executor
    from registry.index import Registry

    pid = os.getpid()
    if pid not in _executors:
        worker_id = os.environ.get("CTXFARM_WORKER_ID")
        _executors[pid] = Executor(settings, Registry.open(settings), backend=os.environ.get("CTXFARM_BACKEND", "qnn"),
                                   worker_id=int(worker_id) if worker_id else None,
                                   owner=os.environ.get("CTXFARM_WORKER_NAME") or None, background_publish=True)
    return _executors[pid]


def _finish(ex: Any, queue: str | None, result: Any, taken: bool = False) -> None:
    """After a build's final outcome: a retry is sent again with its backoff, a success gets its
    probes. Runs in the task, or on the executor's publisher thread. ``taken``: the build was
    claimed from the index (``_next_builds``): its own message is taken out of the broker list
    first (left there, it would cost some worker a task start and a claim that finds the build
    final)."""
    from farm.pipeline.reconcile import schedule_probes

    if taken and queue:
        try:
            from farm.pipeline.queues import unlist

            unlist(_broker(), queue, result.build_id)
        except Exception:  # the message stays: its task finds the build final and drops it
            log.warning("could not take build %s's message off %s", result.build_id, queue, exc_info=True)

    if result.outcome in ("succeeded", "failed", "exhausted"):
        try:  # the last part of a genai package sends the package's build (the fan-in)
            from farm.pipeline.genai import after_part

            for pkg_id, pkg_queue in after_part(settings, ex.registry, result.build_id, app):
                if pkg_queue in genai_queues():
                    assemble_now(ex, pkg_id, pkg_queue)
        except Exception:
            import logging

            logging.getLogger("ctxfarm.genai").warning("could not send a genai package's build", exc_info=True)
    if result.outcome == "retry":
        if queue:
            send(app, COMPILE_TASK, [result.build_id], queue, countdown=result.countdown)
    elif result.outcome == "succeeded" and result.artifact_id is not None:
        schedule_probes(ex, result.artifact_id)
        try:  # the accuracy check, a follow-up task (never on the answer's path)
            from farm.pipeline.accuracy import after_publish

            after_publish(settings, ex.registry, result.build_id, result.artifact_id)
        except Exception:
            import logging

            logging.getLogger("ctxfarm.accuracy").warning("could not schedule the accuracy check", exc_info=True)


def drain() -> None:
    """Let this process's publication in flight finish (the worker is stopping)."""
    ex = _executors.get(os.getpid())
    if ex is not None:
        ex.drain()


@app.task(name=COMPILE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def compile_model(self: Any, build_id: int) -> str:
    if not isinstance(build_id, int) or isinstance(build_id, bool) or not 0 < build_id < 2**31:
        return "refused"  # not a message we sent: acknowledge and drop
    queue = self.request.delivery_info.get("routing_key") if self.request.delivery_info else None
    if _draining() and queue:
        # This worker is draining (a rollout's preStop hook): hand the build to another worker.
        send(app, COMPILE_TASK, [build_id], queue)
        return "drained"
    ex = executor()
    pause = float(os.environ.get("CTXFARM_TEST_PAUSE_BEFORE_EXECUTE", "0") or 0)
    if pause > 0:  # test hook: a worker that took the message and dies before claiming the row
        time.sleep(pause)

    def this_build() -> Any:
        from farm.pipeline.genai import execute_package

        # A genai package's build compiles nothing: it is assembled from its parts' builds.
        result = execute_package(ex, build_id)
        if result is None:
            result = ex.execute(build_id, then=lambda r: _published(ex, queue, r))
        return result

    outcome = str(_one(ex, queue, this_build).outcome)
    try:
        if queue:
            _next_builds(ex, queue)
    finally:
        ex.idle()  # no next compile from this task: a publication waiting for one goes ahead
    return outcome


def _one(ex: Any, queue: str | None, run: Callable[[], Any], *, taken: bool = False) -> Any:
    """One build on this worker: signals interrupt it, a rollout waits for it, then its outcome's
    follow-ups. None when ``run`` found no build. ``taken``: claimed from the index, its
    message still in the broker (``_next_builds``)."""
    executing.set()
    _busy(True)
    result = None
    try:
        # A compiled build is published on the executor's publisher thread while the next
        # build is taken: its lease is held until the commit (a worker that dies meanwhile
        # leaves it to the lease and the reconciler, as one that dies mid-compile does).
        result = run()
    finally:
        executing.clear()
        if result is None or result.outcome != "publishing":
            _busy(False)  # else once published: a rollout's preStop waits for the commit too
    if result is not None and result.outcome != "publishing":
        _finish(ex, queue, result, taken)
    return result


# A task that goes on with the queue's next builds (below) starts no new one after this long: the
# task's soft time limit (prefork) is the compile timeout + 240 s, and the broker re-delivers an
# unacknowledged message after the visibility timeout (by default at least twice the compile
# timeout; a re-delivered message finds its build final and is dropped, but costs a task start).
CHAIN_S = min(200.0, settings.effective_visibility_timeout / 2)


def _next_builds(ex: Any, queue: str) -> None:
    """The builds waiting on this queue, taken here from the index one after another
    (``Executor.execute_next``) rather than each through the broker (Celery's acknowledgement,
    the next message, the task's start: ~20 ms a build, measured), and each one's message taken
    out of the broker list. Stops when none is queued, when the worker is asked to stop or to
    drain, and after ``CHAIN_S``."""
    from celery.worker import state as worker_state

    deadline = time.monotonic() + CHAIN_S
    while time.monotonic() < deadline and not _draining():
        if worker_state.should_stop is not None or worker_state.should_terminate is not None:
            return
        if _one(ex, queue, lambda: ex.execute_next(queue, then=lambda r: _published(ex, queue, r, True)),
                taken=True) is None:
            return


_brokers: dict[int, Any] = {}


def _broker() -> Any:
    """This process's redis-py client of the broker (its list operations)."""
    pid = os.getpid()
    if pid not in _brokers:
        import redis

        _brokers[pid] = redis.Redis.from_url(settings.broker_url or "", socket_timeout=5, socket_connect_timeout=5)
    return _brokers[pid]


def _draining() -> bool:
    return bool(DRAIN_FILE and os.path.exists(DRAIN_FILE))


def _published(ex: Any, queue: str | None, result: Any, taken: bool = False) -> None:
    _finish(ex, queue, result, taken)
    if not executing.is_set():
        _busy(False)


@app.task(name=TWIN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
def compile_twin(self: Any, twin_id: int) -> str:
    """A genai part's twin build (farm.pipeline.genai.twin_builds). Publication wins: the builds
    queued on this toolchain's compile queue (the parts a package waits on) are taken from the
    index first; then the twin compiles, niced and admitted after any compile that waits."""
    if not isinstance(twin_id, int) or isinstance(twin_id, bool) or not 0 < twin_id < 2**31:
        return "refused"
    queue = self.request.delivery_info.get("routing_key") if self.request.delivery_info else None
    if _draining() and queue:
        send(app, TWIN_TASK, [twin_id], queue)
        return "drained"
    from farm.pipeline.genai.twin_builds import execute_twin
    from farm.pipeline.queues import compile_queue
    from registry.models import TwinBuild

    ex = executor()
    with ex.registry.db.session() as s:
        row = s.get(TwinBuild, twin_id)
        first = compile_queue(row.backend, row.toolchain) if row is not None and row.state == "queued" else None
    try:
        if first:
            _next_builds(ex, first)
    finally:
        ex.idle()
    executing.set()
    _busy(True)
    try:
        result = execute_twin(ex, twin_id)
    finally:
        executing.clear()
        _busy(False)
    if result.outcome == "retry" and queue:
        send(app, TWIN_TASK, [twin_id], queue, countdown=result.countdown)
    return str(result.outcome)


@app.task(name=PROBE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=3)
def probe_artifact(self: Any, artifact_id: int) -> str | None:
    from farm.core.errors import ResourceLimitError

    if not isinstance(artifact_id, int) or isinstance(artifact_id, bool) or not 0 < artifact_id < 2**31:
        return None
    try:
        result: str | None = executor().probe(artifact_id)
        return result
    except ResourceLimitError as exc:
        raise self.retry(countdown=60, exc=exc) from None


ACCURACY_TASK = "ctxfarm.check_accuracy"  # farm.pipeline.accuracy.ACCURACY_TASK


@app.task(name=ACCURACY_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=2)
def check_accuracy(self: Any, artifact_id: int) -> str | None:
    """The artifact run on this worker's runtime against the CPU reference (farm.pipeline.accuracy);
    its own time budget (FARM_ACCURACY_BUDGET) ends it, whatever the model."""
    if not isinstance(artifact_id, int) or isinstance(artifact_id, bool) or not 0 < artifact_id < 2**31:
        return None
    from farm.pipeline.accuracy import run_task

    return run_task(settings, executor().registry, artifact_id)


_boards: dict[int, Any] = {}


@app.task(name=PACKAGE_TASK, acks_late=True, reject_on_worker_lost=True)
def make_package(ref: str, key: str) -> str:
    """An ORT model package for a service without onnxruntime >= 1.32 (farm.pipeline.package_jobs):
    made as `farm package` makes it, a failure recorded where the service reads it."""
    import re

    if not isinstance(ref, str) or len(ref) > 400 or not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
        return "refused"  # not a message we sent: acknowledge and drop
    from farm.pipeline.execute import signer_for
    from farm.pipeline.package_jobs import RedisPackageBoard, make_for_service

    pid = os.getpid()
    if pid not in _boards:
        _boards[pid] = RedisPackageBoard(settings.broker_url or "")
    return make_for_service(settings, executor().registry, ref, key, _boards[pid], signer=signer_for(settings))
