"""``farm worker``: detect the toolchain of this environment, register, heartbeat, serve its queues.

The heartbeat thread also re-sends queued builds of this worker's queues whose message is older
than FARM_REQUEUE_AFTER (a broker restarted without persistence loses its lists; the SQL index
does not), so nothing queued is lost.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

from farm.config import Settings

log = logging.getLogger("ctxfarm.worker")


def serve(settings: Settings, backend: str, *, concurrency: int = 1, loglevel: str = "INFO") -> int:
    from farm.celery_app import COMPILE_TASK, compile_queue, probe_queue
    from registry.index import Registry, heartbeat, register_worker
    from workers.runner import get_runner

    toolchain = get_runner(backend).toolchain()
    target = _trt_target(backend)
    queues = [compile_queue(backend, toolchain.version, target), probe_queue(backend, toolchain.version)]
    if backend == "trt":
        # Hardware-compatible (Ampere+) engines can be built on any sm_80+ GPU.
        queues.append(compile_queue(backend, toolchain.version, "ampere_plus"))
    host = socket.gethostname()
    name = f"{backend}-{toolchain.version}@{host}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    reg = Registry.open(settings)
    with reg.db.session() as s:
        worker_id = register_worker(s, name=name, host=host, pid=os.getpid(), toolchain=toolchain, queues=queues,
                                    extra={"target": target} if target else {})
    os.environ.update(CTXFARM_WORKER_ID=str(worker_id), CTXFARM_WORKER_NAME=name, CTXFARM_BACKEND=backend)
    if target:
        os.environ["CTXFARM_GPU_TARGET"] = target
    print(f"worker {name}: {backend} {toolchain.version} (onnxruntime {toolchain.ort_version}, "
          f"{toolchain.ep_package} {toolchain.ep_version}) serving {', '.join(queues)}", flush=True)

    # Import Celery (and build the app) before any thread starts: celery's lazy module is not
    # safe to import from two threads at once.
    from farm.celery_app import send
    from registry.index import stale_queued
    from workers.tasks import app

    stop = threading.Event()

    def beat() -> None:
        compile_queues = [q for q in queues if q.startswith("compile.")]
        while not stop.wait(settings.heartbeat_seconds):
            try:
                with reg.db.session() as s:
                    heartbeat(s, worker_id)
                    stale = stale_queued(s, compile_queues, settings.requeue_after)
                for build_id, queue in stale:
                    log.warning("re-sending queued build %s (its message is older than %ss)", build_id,
                                settings.requeue_after)
                    send(app, COMPILE_TASK, [build_id], queue)
            except Exception:
                log.warning("heartbeat failed", exc_info=True)

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        worker: Any = app.Worker(queues=queues, concurrency=concurrency, pool="prefork", loglevel=loglevel,
                                 hostname=name, without_gossip=True, without_mingle=True, optimization="fair")
        worker.start()
        return int(getattr(worker, "exitcode", 0) or 0)
    finally:
        stop.set()
        with reg.db.session() as s:
            heartbeat(s, worker_id, stopped=True)
        reg.close()


def _trt_target(backend: str) -> str | None:
    if backend != "trt":
        return None
    from workers.trt.runner import detect_gpu

    return detect_gpu().target
