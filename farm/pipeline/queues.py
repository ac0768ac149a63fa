"""The Celery app: Redis broker, one queue per (backend, toolchain), tasks sent by name.

``farm`` only sends (``send_task`` by name, after the DB commit); the task bodies live in
``workers.tasks`` and are imported by workers alone. Results are tracked in SQL, never in a
Celery result backend (chords on Redis lose counts).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from farm.core.errors import ConfigError, MissingExtraError, NoWorkerError
from farm.core.settings import Settings

COMPILE_TASK = "ctxfarm.compile_model"
PROBE_TASK = "ctxfarm.probe_artifact"
# An ORT model package made by a worker for a service without onnxruntime >= 1.32 (sent to the
# probe queue of a worker that has it: farm.pipeline.package_jobs).
PACKAGE_TASK = "ctxfarm.make_package"
# A genai part's twin build (farm.pipeline.genai.twin_builds), sent to the genai queue of its SDK:
# only the workers that make packages (and run their twin) take it.
TWIN_TASK = "ctxfarm.compile_twin"


def compile_queue(backend: str, toolchain: str, target: str | None = None) -> str:
    """compile.qnn.2.51.0 ; TensorRT builds for the GPU it runs on: compile.trt.10.13.sm_90.
    Made only from catalog names and validated versions, never from user-supplied names."""
    if backend == "trt" and target:
        return f"compile.trt.{toolchain}.{target}"
    return f"compile.{backend}.{toolchain}"


def genai_queue(backend: str, toolchain: str) -> str:
    """compile.qnn.2.51.0.genai: the package builds of LLM releases (assembly, folder check, twin),
    served only by the workers of that toolchain that announce they can make them
    (``farm.core.capabilities``); their parts go to ``compile_queue`` like any build."""
    return f"compile.{backend}.{toolchain}.genai"


def probe_queue(backend: str, toolchain: str) -> str:
    return f"probe.{backend}.{toolchain}"


def make_app(settings: Settings) -> Any:
    if not settings.broker_url:
        raise ConfigError("FARM_BROKER_URL is not set: cluster commands need a Redis broker",
                          hint="export FARM_BROKER_URL=redis://127.0.0.1:6379/0 (or use `farm build` embedded)")
    try:
        from celery import Celery
    except ModuleNotFoundError:
        from farm.core.extras import install_hint

        raise MissingExtraError("celery is not installed", hint=install_hint("cluster")) from None
    app = Celery("ctxfarm", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        task_default_queue="ctxfarm.default",
        task_create_missing_queues=True,
        broker_transport_options={"visibility_timeout": settings.effective_visibility_timeout},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        # Our own compile timeout kills the compile child; the task limit is the backstop.
        task_time_limit=settings.compile_timeout + 300,
        task_soft_time_limit=settings.compile_timeout + 240,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


_apps: dict[tuple[str, float, float], Any] = {}
_apps_lock = threading.Lock()


def shared_app(settings: Settings) -> Any:
    """This process's app for these settings, made once: a Celery app (its imports, its
    producer and connection pools) costs tens of ms to build, too much for every submission
    of a long-lived process (the HTTP service, a worker scheduling probes). Forgotten in a
    forked child, whose pools must not be the parent's."""
    key = (settings.broker_url or "", settings.effective_visibility_timeout, settings.compile_timeout)
    with _apps_lock:
        if key not in _apps:
            _apps[key] = make_app(settings)
        return _apps[key]


os.register_at_fork(after_in_child=_apps.clear)


# A broker that answered this recently is not asked again (each check opens a connection: ~5-8 ms
# of a service's CPU per release, measured; six releases at once paid it six times). A broker lost
# within the window fails the send after the commit instead: the rows stay queued and the
# reconciler sends them once a worker sees the broker again (farm.pipeline.reconcile).
BROKER_OK_S = 1.0
_broker_ok: dict[int, float] = {}


def check_broker(app: Any, timeout: float = 3.0) -> None:
    """Fail fast and clearly when the broker is down, before anything is written."""
    import time

    if time.monotonic() - _broker_ok.get(id(app), -BROKER_OK_S) < BROKER_OK_S:
        return
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
    except Exception as exc:
        _broker_ok.pop(id(app), None)
        raise NoWorkerError(f"the broker {app.conf.broker_url} is unreachable: {exc}",
                            hint="check FARM_BROKER_URL and that Redis is running; nothing was submitted") from None
    _broker_ok[id(app)] = time.monotonic()


def send(app: Any, task: str, args: list[Any], queue: str, *, countdown: float | None = None) -> None:
    app.send_task(task, args=args, queue=queue, routing_key=queue, countdown=countdown or None)


# kombu's Redis transport keeps a queue as a list per priority step: "<queue>" and
# "<queue>\x06\x16<n>"; a message is JSON whose body is base64 of [args, kwargs, embed].
_PRIORITY_SEP = "\x06\x16"
PENDING_SCAN_LIMIT = 10000


def _build_id_of(raw: bytes | str, task: str = COMPILE_TASK) -> int | None:
    """The build id of a compile message (``task``: of a twin build's) as kombu's Redis transport
    stores it; None for any other message."""
    import base64
    import json

    try:
        msg = json.loads(raw)
        body = msg["body"]
        if msg.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        if msg.get("headers", {}).get("task") == task and args:
            return int(args[0])
    except (ValueError, KeyError, TypeError, IndexError):
        pass
    return None  # not one of ours


UNLIST_SCAN = 64  # the oldest messages of a queue a worker looks through for the build it took


def unlist(client: Any, queue: str, build_id: int) -> bool:
    """Take the compile message of ``build_id`` out of ``queue``'s broker list, where a worker
    that claimed the build from the index (``Executor.execute_next``) finds it: among the oldest
    ``UNLIST_SCAN`` messages (kombu pushes on the left and takes from the right). Left there, it
    would cost some worker a task start and a claim that finds the build taken; not found (taken
    already, or never sent), nothing changes. ``client``: a redis-py client of the broker."""
    for raw in client.lrange(queue, -UNLIST_SCAN, -1):
        if _build_id_of(raw) == build_id:
            return bool(client.lrem(queue, 1, raw))
    return False


def pending_build_ids(broker_url: str, queues: list[str], *, limit: int = PENDING_SCAN_LIMIT,
                      task: str = COMPILE_TASK) -> set[int]:
    """Build ids whose compile message (``task``: twin builds') still waits in one of these
    broker lists (not taken by any worker). The reconciler re-sends only builds that have none,
    so a backlog is never multiplied. Reads at most ``limit`` messages per list."""
    import redis

    client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        out: set[int] = set()
        for queue in queues:
            keys = [queue, *(k.decode() for k in client.scan_iter(match=f"{queue}{_PRIORITY_SEP}*", count=100))]
            for key in keys:
                for raw in client.lrange(key, 0, limit - 1):
                    build_id = _build_id_of(raw, task)
                    if build_id is not None:
                        out.add(build_id)
        return out
    finally:
        client.close()
