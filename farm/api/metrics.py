"""Prometheus metrics and readiness of the HTTP service (prometheus_client).

Builds by state and queue depth per queue are read when scraped (SQL is the truth, Redis holds
the queues); resolve latency and bytes served are measured in this process; the compile-seconds
histogram is built from the index's artifacts. Under ``farm serve --workers N`` (the
``PROMETHEUS_MULTIPROC_DIR`` it sets) each process writes its measures to a file there and every
process's ``/metrics`` adds up all of them (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from farm.core.settings import Settings
from registry.index import Registry

COMPILE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


class _IndexCollector:
    def __init__(self, settings: Settings, reg: Registry):
        self.settings, self.reg = settings, reg

    def collect(self) -> Any:
        from sqlalchemy import case, func, select

        from farm.pipeline.states import BuildState
        from registry.models import Artifact, Build, Worker

        builds = GaugeMetricFamily("ctxfarm_builds", "Build rows by state", labels=["state"])
        hist = HistogramMetricFamily("ctxfarm_compile_seconds", "EP compile time of published artifacts",
                                     labels=["backend"])
        depth = GaugeMetricFamily("ctxfarm_queue_depth", "Messages waiting per queue", labels=["queue"])
        try:
            with self.reg.db.session() as s:
                # Every state has its series from the start (0 included): an alert on
                # ctxfarm_builds{state="queued"} must not wait for the first queued build.
                by_state = dict.fromkeys((str(st) for st in BuildState), 0)
                for state, n in s.execute(select(Build.state, func.count()).group_by(Build.state)):
                    by_state[str(state)] = int(n)
                for state, n in by_state.items():
                    builds.add_metric([state], n)
                cols = [func.sum(case((Artifact.compile_seconds <= b, 1), else_=0)) for b in COMPILE_BUCKETS]
                for row in s.execute(select(Artifact.backend, func.count(), func.sum(Artifact.compile_seconds), *cols)
                                     .group_by(Artifact.backend)):
                    backend, n, total, *counts = row
                    buckets = [(str(b), int(c or 0)) for b, c in zip(COMPILE_BUCKETS, counts, strict=True)]
                    hist.add_metric([backend], buckets + [("+Inf", int(n))], float(total or 0))
                queues = sorted({q for w in s.scalars(select(Worker.queues)) for q in w if q.startswith("compile.")})
        except Exception:  # a scrape must not fail because the DB blinked
            queues = []
        if self.settings.broker_url and queues:
            try:
                import redis

                client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=2, socket_connect_timeout=2)
                for q in queues:
                    depth.add_metric([q], client.llen(q))
                client.close()
            except Exception:
                pass
        yield builds
        yield hist
        yield depth


class Metrics:
    def __init__(self, settings: Settings, reg: Registry):
        self.settings, self.reg = settings, reg
        # prometheus_client reads the variable itself, when it is imported: this only follows it.
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        self.resolve_seconds = Histogram("ctxfarm_resolve_seconds", "Resolve latency in the service",
                                         registry=self.registry,
                                         buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
        self.bytes_served = Counter("ctxfarm_blob_bytes_served", "Blob bytes streamed by the service",
                                    registry=self.registry)
        # Request bodies of uploads (models, upload sessions, blobs): what clients sent.
        self.bytes_received = Counter("ctxfarm_upload_bytes_received", "Upload bytes received by the service",
                                      registry=self.registry)
        self.long_polls = Gauge("ctxfarm_long_polls_waiting", "GET /v1/releases/ID?wait= requests waiting now",
                                registry=self.registry, multiprocess_mode="livesum")
        self.registry.register(_IndexCollector(settings, reg))  # type: ignore[arg-type]
        # What /metrics renders: ``registry`` (where routes make their metrics too), or under
        # several processes every process's files (their measures, routes' included) and the
        # index's figures once; rendering both would list each measure twice.
        self.exposed = self.registry
        if self.multiprocess:
            from prometheus_client import multiprocess

            self.exposed = CollectorRegistry()
            multiprocess.MultiProcessCollector(self.exposed)
            self.exposed.register(_IndexCollector(settings, reg))  # type: ignore[arg-type]

    def watch_long_polls(self, polls: Any) -> None:
        """The long-poll gauge follows ``polls`` (``farm.api.longpoll.LongPolls``): read when
        scraped in one process; written on each change under several (a file per process)."""
        if self.multiprocess:
            polls.on_count = self.long_polls.set
        else:
            self.long_polls.set_function(polls.count)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.exposed), CONTENT_TYPE_LATEST

    def readiness(self) -> dict[str, bool]:
        from sqlalchemy import text

        checks: dict[str, bool] = {}
        try:
            with self.reg.db.session() as s:
                s.execute(text("SELECT 1"))
            checks["database"] = True
        except Exception:
            checks["database"] = False
        try:
            list(zip(range(1), self.reg.store.iter_blobs(), strict=False))
            checks["store"] = True
        except Exception:
            checks["store"] = False
        if self.settings.broker_url:
            try:
                import redis

                client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=2, socket_connect_timeout=2)
                checks["broker"] = bool(client.ping())
                client.close()
            except Exception:
                checks["broker"] = False
        return checks
