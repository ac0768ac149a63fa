"""Celery tasks, imported by workers only. Thin: ids in, logic in ``workers.base``."""

from __future__ import annotations

import os
from typing import Any

from farm.celery_app import COMPILE_TASK, PROBE_TASK, make_app
from farm.config import Settings

settings = Settings.from_env()
app = make_app(settings)

_ctx: dict[int, Any] = {}


def context() -> Any:
    """The WorkerContext of this process (pool children each build their own after the fork)."""
    from workers.base import WorkerContext

    pid = os.getpid()
    if pid not in _ctx:
        _ctx[pid] = WorkerContext.create(settings, os.environ.get("CTXFARM_BACKEND", "qnn"))
    return _ctx[pid]


@app.task(name=COMPILE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None)
def compile_model(self: Any, build_id: int) -> str:
    from workers.base import compile_build

    outcome, countdown = compile_build(context(), build_id)
    if outcome in ("busy", "retry"):
        # A new message with a delay; this one is acked. The DB row decides who compiles.
        raise self.retry(countdown=countdown)
    return outcome


@app.task(name=PROBE_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=3)
def probe_artifact(self: Any, artifact_id: int) -> str | None:
    from farm.errors import CompileTimeoutError
    from workers.base import probe_artifact as probe

    try:
        return probe(context(), artifact_id)
    except CompileTimeoutError as exc:
        raise self.retry(countdown=60, exc=exc) from None
