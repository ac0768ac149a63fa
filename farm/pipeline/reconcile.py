"""Cluster upkeep run by every worker's heartbeat: the SQL index is the truth, the broker a hint.

``reconcile`` re-sends only builds that have no live message: running under an expired lease
(the executor died mid-build) and queued builds whose message waits in no broker list (taken by
a worker that died before claiming it, or lost with the broker). A build whose message still
waits behind a backlog is left alone. With the defaults (lease 60 s, heartbeat 10 s) a build
whose worker died runs again within about 70 s when a worker of its toolchain is live.
"""

from __future__ import annotations

import logging
from typing import Any

from farm.core.settings import Settings
from farm.pipeline import states
from farm.pipeline.queues import (
    COMPILE_TASK,
    PROBE_TASK,
    TWIN_TASK,
    pending_build_ids,
    probe_queue,
    send,
    shared_app,
)
from registry.index import Registry

log = logging.getLogger("ctxfarm.reconcile")


def reconcile(settings: Settings, registry: Registry, app: Any, queues: list[str]) -> list[tuple[int, str]]:
    """One pass: re-send what lost its message or executor on these compile queues."""
    if not settings.broker_url:
        return []
    pending = pending_build_ids(settings.broker_url, queues)
    with registry.db.session() as s:
        taken = states.take_orphans(s, queues, resend_after=settings.resend_after, pending=pending)
    for build_id, queue in taken:
        log.warning("re-sending build %s to %s (no live message or executor)", build_id, queue)
        send(app, COMPILE_TASK, [build_id], queue)
    # A genai part's twin builds (on the genai queues): the same rules, their own task.
    from registry.models import TwinBuild

    pending = pending_build_ids(settings.broker_url, queues, task=TWIN_TASK)
    with registry.db.session() as s:
        twins = states.take_orphans(s, queues, resend_after=settings.resend_after, pending=pending, table=TwinBuild)
    for twin_id, queue in twins:
        log.warning("re-sending twin build %s to %s (no live message or executor)", twin_id, queue)
        send(app, TWIN_TASK, [twin_id], queue)
    return taken


def schedule_probes(executor: Any, artifact_id: int) -> list[str]:
    """Ask every other live toolchain of this backend to load the new artifact."""
    from registry.index import live_workers

    settings: Settings = executor.settings
    if not settings.broker_url:
        return []
    tc = executor.toolchain
    with executor.registry.db.session() as s:
        versions = sorted({w.toolchain for w in live_workers(s, stale_after=settings.worker_stale_after)
                           if w.backend == tc.backend and w.toolchain != tc.version})
    if not versions:
        return []
    app = shared_app(settings)
    for v in versions:
        send(app, PROBE_TASK, [artifact_id], probe_queue(tc.backend, v))
    return versions
