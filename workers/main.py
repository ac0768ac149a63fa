"""``farm worker``: detect the toolchain of this environment, register, heartbeat, serve its queues.

The heartbeat thread also reconciles (farm.pipeline.reconcile): builds of this worker's queues
whose executor died or whose message was lost are sent again, so nothing queued is lost.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import Any

from farm.core.settings import Settings

log = logging.getLogger("ctxfarm.worker")


def serve(settings: Settings, backend: str, *, concurrency: int = 1, loglevel: str = "INFO") -> int:
    from farm.core.capabilities import GENAI_PACKAGE, short_list
    from farm.pipeline.queues import compile_queue, genai_queue, probe_queue
    from registry.index import Registry, heartbeat, register_worker
    from workers.backends import get_runner
    from workers.capabilities import here

    toolchain = get_runner(backend).toolchain()
    target = _trt_target(backend)
    # What this environment makes besides context binaries, announced with the row: releases
    # route genai package builds (and ORT model packages) only to workers that can make them.
    capabilities = here(backend)
    queues = [compile_queue(backend, toolchain.version, target), probe_queue(backend, toolchain.version)]
    if GENAI_PACKAGE in capabilities.makes:
        queues.append(genai_queue(backend, toolchain.version))
    if backend == "trt":
        # Hardware-compatible (Ampere+) engines can be built on any sm_80+ GPU.
        queues.append(compile_queue(backend, toolchain.version, "ampere_plus"))
    expected = os.environ.get("CTXFARM_WORKER_QUEUE")  # set by a deployment's pool (infra/k8s, compose)
    if expected and expected not in queues:
        from farm.core.errors import ConfigError

        raise ConfigError(f"this worker serves {', '.join(queues)}, but its pool is for {expected}",
                          hint="the image's toolchain (or GPU) does not match the pool: fix the deployment")
    host = socket.gethostname()
    name = f"{backend}-{toolchain.version}@{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    reg = Registry.open(settings)
    with reg.db.session() as s:
        worker_id = register_worker(s, name=name, host=host, pid=os.getpid(), toolchain=toolchain, queues=queues,
                                    extra={**capabilities.to_extra(), **({"target": target} if target else {})})
    os.environ.update(CTXFARM_WORKER_ID=str(worker_id), CTXFARM_WORKER_NAME=name, CTXFARM_BACKEND=backend,
                      CTXFARM_GENAI_QUEUES=",".join(q for q in queues if q.endswith(".genai")))
    if target:
        os.environ["CTXFARM_GPU_TARGET"] = target
    print(f"worker {name}: {backend} {toolchain.version} (onnxruntime {toolchain.ort_version}, "
          f"{toolchain.ep_package} {toolchain.ep_version}) serving {', '.join(queues)}; makes "
          f"{short_list(capabilities.makes)}", flush=True)
    for what, why in sorted(capabilities.lacks.items()):
        log.info("this worker can't make %s: %s", what, why)

    # Import Celery (and build the app) before any thread starts: celery's lazy module is not
    # safe to import from two threads at once.
    from farm.pipeline.reconcile import reconcile
    from workers.tasks import app

    stop = threading.Event()
    compile_queues = [q for q in queues if q.startswith("compile.")]

    alive_file = os.environ.get("CTXFARM_HEARTBEAT_FILE")  # the container HEALTHCHECK reads its age

    def beat() -> None:
        while not stop.wait(settings.heartbeat_seconds):
            try:
                with reg.db.session() as s:
                    heartbeat(s, worker_id)
                if alive_file:
                    Path(alive_file).touch()
                reconcile(settings, reg, app, compile_queues)
            except Exception:
                log.warning("heartbeat failed", exc_info=True)

    _interrupt_builds_on_signals()
    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        # One compile per worker process runs in the main thread ("solo"), so SIGTERM/SIGINT can
        # interrupt it there: the lease is released at once and the temp dir removed. More
        # concurrency uses a prefork pool whose children do the same on SIGTERM.
        pool = "solo" if concurrency == 1 else "prefork"
        _warm_compile_host(backend, concurrency)
        worker: Any = app.Worker(queues=queues, concurrency=concurrency, pool=pool, loglevel=loglevel,
                                 hostname=name, without_gossip=True, without_mingle=True, optimization="fair")
        worker.start()
        return int(getattr(worker, "exitcode", 0) or 0)
    finally:
        from workers.tasks import drain

        drain()  # a build still publishing in the background commits before we say we stopped
        stop.set()
        with reg.db.session() as s:
            heartbeat(s, worker_id, stopped=True)
        reg.close()


def _warm_compile_host(backend: str, concurrency: int) -> None:
    """Before the first build, not during it: the warm compile host (workers.host) started, this
    process's executor built (index, store, runner, bundle cache) and warmed (``Executor.warm``),
    and onnx imported (the compile's output is read with it). Here for the solo pool, in each
    child for prefork (hosts and executors belong to the process that compiles). Measured on a
    fresh worker's first build: ~60 ms of executor set-up before its claim and ~90 ms importing
    onnx after its compile."""
    from celery import signals

    from workers.backends import get_runner

    warm = getattr(get_runner(backend), "warm", None)  # None: TensorRT compiles in a fresh child

    def start(**_: Any) -> None:
        try:
            if warm is not None:
                warm()
            import onnx  # noqa: F401

            from workers.tasks import executor

            executor().warm()
        except Exception:  # the first build does each again and fails with the reason
            log.warning("warming up before the first build failed", exc_info=True)

    if concurrency == 1:
        start()
    else:
        signals.worker_process_init.connect(start, weak=False)


def _interrupt_builds_on_signals() -> None:
    """Once Celery has installed its own handlers: SIGTERM/SIGINT while a build executes raise
    ``Interrupted`` in it (the executor releases the lease, the temp dir goes, the worker
    stops); while idle they do what Celery does (warm shutdown)."""
    import signal

    from celery import signals

    from farm.core.errors import Interrupted
    from workers import tasks

    def wrap(sig: int) -> None:
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any) -> None:
            if tasks.executing.is_set():
                raise Interrupted(signum)
            if callable(previous):
                previous(signum, frame)
            else:
                raise SystemExit(128 + signum)

        signal.signal(sig, handler)

    def install(**_: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            wrap(sig)

    signals.worker_ready.connect(install, weak=False)
    signals.worker_process_init.connect(install, weak=False)


def _trt_target(backend: str) -> str | None:
    if backend != "trt":
        return None
    from workers.backends import detect_gpu, trt_serves

    target = detect_gpu().target
    trt_serves(target, target, {})  # a GPU missing from the catalog: a clear error, before registering
    return target
