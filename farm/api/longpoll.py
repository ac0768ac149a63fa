"""Long polls (``GET /v1/releases/ID?wait=S``) that hold no thread while they wait.

A waiting request is a coroutine: it sleeps on an ``asyncio.Event`` set by one feed thread per
process (build events: Redis pub/sub with a broker, this process's executors without one,
``farm.pipeline.events``), wakes at least every ``FALLBACK_POLL_S`` (events are at-most-once) or
when its client hangs up, and reads SQL in short calls on a small executor of its own. The
shared threadpool, which serves ``/healthz``, ``/readyz``, ``/v1/resolve`` and every other
synchronous route, is never taken by a waiter, and waiters are capped, per token and in all
(over either cap: 429 ``rate-limited``, with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from farm.core import errors as E
from farm.core.settings import Settings
from farm.pipeline import plan
from registry.index import Registry

log = logging.getLogger("ctxfarm.api")
T = TypeVar("T")

MAX_WAITERS = 256  # long polls waiting at once, in all
MAX_WAITERS_PER_TOKEN = 32  # ... and per token: one client can't take every slot
READERS = 4  # threads that read SQL for waiters (short calls), apart from the shared pool
FALLBACK_POLL_S = 5.0  # a waiter reads again at least this often: an event can be lost
FEED_IDLE_S = 30.0  # the feed thread (and its broker connection) ends after this long with no waiter


@dataclass(eq=False)
class _Ticket:
    loop: asyncio.AbstractEventLoop
    builds: frozenset[int] | None = None  # the waiter's release's builds; None: woken by any event
    event: asyncio.Event = field(default_factory=asyncio.Event)


class BuildFeed:
    """One thread that turns build events into wake-ups of the waiting coroutines (on
    whichever event loop each waits). Started by the first waiter; it ends after
    ``FEED_IDLE_S`` with none, or on ``close``."""

    def __init__(self, broker_url: str | None):
        self.broker_url = broker_url
        self._tickets: set[_Ticket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def listen(self, builds: frozenset[int] | None = None) -> _Ticket:
        """A ticket woken by events about ``builds`` (any build when None)."""
        ticket = _Ticket(asyncio.get_running_loop(), builds)
        with self._lock:
            self._tickets.add(ticket)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, name="build-feed", daemon=True)
                self._thread.start()
        return ticket

    def forget(self, ticket: _Ticket) -> None:
        with self._lock:
            self._tickets.discard(ticket)

    def _run(self) -> None:
        from farm.pipeline.events import Subscription

        idle_since = time.monotonic()
        try:
            with Subscription(self.broker_url) as sub:
                while not self._stop.is_set():
                    ids = sub.next_events(1.0)
                    if ids is None or ids:
                        self._wake(ids)
                    with self._lock:
                        if self._tickets:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since > FEED_IDLE_S:
                            self._thread = None  # nobody waits: the next waiter starts a new feed
                            return
        except Exception:  # the fallback poll still answers every waiter
            log.exception("build event feed stopped")
        with self._lock:
            self._thread = None

    def _wake(self, ids: set[int] | None = None) -> None:
        """Wake the waiters of releases with a build in ``ids`` (every waiter when None): six
        pipelines waiting on their releases read SQL for their own builds' events only."""
        with self._lock:
            tickets = [t for t in self._tickets if ids is None or t.builds is None or not t.builds.isdisjoint(ids)]
        for t in tickets:
            try:
                t.loop.call_soon_threadsafe(t.event.set)
            except RuntimeError:  # its loop is closed: that waiter is gone
                self.forget(t)

    def close(self) -> None:
        self._stop.set()


class LongPolls:
    """The service's long polls: admission (the caps), the feed and the readers."""

    def __init__(self, settings: Settings, reg: Registry, *, max_waiters: int = MAX_WAITERS,
                 max_per_token: int = MAX_WAITERS_PER_TOKEN, readers: int = READERS):
        self.settings, self.reg = settings, reg
        self.max_waiters, self.max_per_token = max_waiters, max_per_token
        self.feed = BuildFeed(settings.broker_url)
        self.readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="longpoll-read")
        self.waiting: Counter[str] = Counter()
        self.total = 0
        self.on_count: Callable[[int], Any] | None = None  # told the new total (the metrics of several processes)

    def count(self) -> int:
        return self.total  # an int: read by /metrics from another thread

    @contextmanager
    def slot(self, token: str) -> Iterator[None]:
        # Called on the event loop only: the counters need no lock.
        key = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        if self.count() >= self.max_waiters:
            raise E.RateLimitedError(f"{self.max_waiters} long polls are waiting already",
                                     hint="poll again later, or without wait=")
        if self.waiting[key] >= self.max_per_token:
            raise E.RateLimitedError(f"this token has {self.max_per_token} long polls waiting already",
                                     hint="wait for one to answer before starting another, or poll without wait=")
        self.waiting[key] += 1
        self.total += 1
        if self.on_count is not None:
            self.on_count(self.total)
        try:
            yield
        finally:
            self.total -= 1
            self.waiting[key] -= 1
            if self.waiting[key] <= 0:
                del self.waiting[key]
            if self.on_count is not None:
                self.on_count(self.total)

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.readers, fn, *args)

    def _status(self, release_id: int) -> plan.ReleaseStatus:
        return plan.release_status(self.settings, release_id, registry=self.reg)

    async def watch(self, release_id: int, wait: float, token: str, disconnected: Callable[[], Any]
                    ) -> plan.ReleaseStatus:
        """The release's status once it is done, once one of its builds changed state, when
        the client hangs up, or after ``wait`` seconds."""
        st = await self.read(self._status, release_id)
        if st.done:
            return st
        seen = _states(st)
        # A release's builds are fixed when it is made: events about other builds need not wake
        # this waiter.
        builds = frozenset(b["build"] for b in st.builds if isinstance(b.get("build"), int)) or None
        return await self.until(lambda now: now.done or _states(now) != seen, self._status, release_id,
                                wait=wait, token=token, disconnected=disconnected, events=builds)

    async def until(self, ready: Callable[[T], bool], fn: Callable[..., T], *args: Any, wait: float, token: str,
                    disconnected: Callable[[], Any], events: frozenset[int] | None,
                    every: float = FALLBACK_POLL_S) -> T:
        """``fn(*args)`` read (on the readers) until ``ready`` says so, the client hangs up, or
        ``wait`` seconds pass: read again on each event about ``events`` (any when None) and at
        least every ``every`` s. Holds a long-poll slot of ``token`` meanwhile."""
        loop = asyncio.get_running_loop()
        with self.slot(token):
            # Listening before the read below: a change after it wakes us.
            ticket = self.feed.listen(events)
            gone = asyncio.ensure_future(disconnected())
            try:
                value = await self.read(fn, *args)
                deadline = loop.time() + wait
                while not ready(value) and not gone.done():
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    woke = asyncio.ensure_future(ticket.event.wait())
                    try:
                        await asyncio.wait({woke, gone}, timeout=min(left, every),
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        woke.cancel()
                    if gone.done():
                        break
                    ticket.event.clear()  # before the read: an event after it wakes the next wait
                    value = await self.read(fn, *args)
                return value
            finally:
                gone.cancel()
                self.feed.forget(ticket)

    def close(self) -> None:
        self.feed.close()
        self.readers.shutdown(wait=False, cancel_futures=True)


async def disconnected(request: Any) -> None:
    """Returns when the client hangs up (its body read already: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _states(st: plan.ReleaseStatus) -> list[tuple[Any, Any]]:
    return [(b.get("build"), b.get("state")) for b in st.builds]
