"""Device reports per token and minute: one count for the whole service.

``farm serve --workers N`` runs N processes, and a cluster runs several services behind one
address: a count kept in each process let a token send N times its ``FARM_REPORTS_PER_MINUTE``.
With a broker (``FARM_BROKER_URL``, Redis), the count is one Redis key per token and wall-clock
minute (``INCR``, expiring after two minutes), shared by every process and host. Without one (the
embedded service: one process), or while Redis does not answer, each process counts for itself;
a Redis outage never refuses a report it would have taken, and is logged once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

log = logging.getLogger("ctxfarm.api")

KEY_PREFIX = "ctxfarm:reports-per-minute"
REDIS_TIMEOUT_S = 0.5  # a report waits this long at most for the shared count, then counts here
RETRY_AFTER_S = 30.0  # after a Redis failure, count here this long before asking Redis again


class ProcessLimiter:
    """Reports per token and minute, in this process (a fixed one-minute window per token;
    the ``size`` most recent tokens are remembered)."""

    def __init__(self, size: int = 100_000):
        self.lock = threading.Lock()
        self.windows: OrderedDict[int, tuple[int, int]] = OrderedDict()
        self.size = size

    def allow(self, token_id: int, per_minute: int) -> bool:
        minute = int(time.time() // 60)
        with self.lock:
            window, n = self.windows.get(token_id, (minute, 0))
            if window != minute:
                n = 0
            if n >= per_minute:
                return False
            self.windows[token_id] = (minute, n + 1)
            self.windows.move_to_end(token_id)
            if len(self.windows) > self.size:
                self.windows.popitem(last=False)
            return True


class ReportLimiter:
    """The service's limiter: shared through Redis when ``broker_url`` is set, else per process."""

    def __init__(self, broker_url: str | None):
        self.broker_url = broker_url
        self.local = ProcessLimiter()
        self._clients: dict[int, Any] = {}  # one redis.asyncio client per event loop (id)
        self._down_until = 0.0
        self._logged = 0.0

    async def allow(self, token_id: int, per_minute: int) -> bool:
        if self.broker_url is None or time.monotonic() < self._down_until:
            return self.local.allow(token_id, per_minute)
        minute = int(time.time() // 60)
        key = f"{KEY_PREFIX}:{token_id}:{minute}"
        try:
            client = self._client()
            async with asyncio.timeout(REDIS_TIMEOUT_S):
                async with client.pipeline(transaction=True) as pipe:
                    n, _ = await pipe.incr(key).expire(key, 120).execute()
        except Exception as exc:  # noqa: BLE001 - any Redis failure: count here, say so once a minute
            self._down_until = time.monotonic() + RETRY_AFTER_S
            if time.monotonic() - self._logged > 60:
                self._logged = time.monotonic()
                log.warning("the shared report count (Redis) did not answer (%s: %s); counting per process for "
                            "%.0f s", type(exc).__name__, str(exc)[:200], RETRY_AFTER_S)
            return self.local.allow(token_id, per_minute)
        return int(n) <= per_minute

    def _client(self) -> Any:
        import redis.asyncio as aredis

        assert self.broker_url is not None  # allow() asks Redis only with a broker
        loop = id(asyncio.get_running_loop())
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = aredis.from_url(self.broker_url, socket_connect_timeout=REDIS_TIMEOUT_S,
                                                           socket_timeout=REDIS_TIMEOUT_S)
        return client
