"""Build events: "build N changed state", told to whoever waits, so no one sleep-polls SQL.

The executor publishes after the transaction that changed the row has committed (claim,
succeed, fail, requeue): in cluster mode a Redis ``PUBLISH`` on the broker, and always to the
waiters of this process (the embedded HTTP service runs its builds in-process). A waiter
(``farm submit --wait``, the service's long poll) subscribes *before* it reads the state, so a
change that lands between the read and the wait still wakes it. An event is only a hint to read
SQL again, which stays the truth: pub/sub is at-most-once (a waiter whose connection drops misses
messages), so a slow fallback poll remains.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Collection
from typing import Any

log = logging.getLogger("ctxfarm.events")

# Pub/sub channels are global to a Redis server (not per numbered database): the database number
# is in the name so two farms on one server don't wake each other (a stray event costs one read).
CHANNEL_PREFIX = "ctxfarm:builds"
# Not a build (their ids start at 1): "a worker made a package, or failed to" (its service's
# waiting POST /v1/packages reads the index again).
PACKAGE_EVENT = 0


def channel(broker_url: str) -> str:
    from urllib.parse import urlparse

    path = urlparse(broker_url).path.strip("/") or "0"
    return f"{CHANNEL_PREFIX}:{path}"


class _LocalHub:
    """Events of this process: a sequence number, the recent build ids, and a condition."""

    def __init__(self, keep: int = 4096):
        self.cond = threading.Condition()
        self.seq = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=keep)

    def publish(self, build_id: int) -> None:
        with self.cond:
            self.seq += 1
            self.recent.append((self.seq, build_id))
            self.cond.notify_all()

    def since(self, seq: int) -> tuple[int, set[int] | None]:
        """(current seq, build ids after ``seq``; None when some were already dropped)."""
        ids = {b for s, b in self.recent if s > seq}
        dropped = bool(self.recent) and self.recent[0][0] > seq + 1
        return self.seq, (None if dropped else ids)


_hub = _LocalHub()


class Publisher:
    """Tells waiters that a build changed. Never raises: a missed event costs a waiter one
    fallback poll, never a build."""

    def __init__(self, broker_url: str | None):
        self.broker_url = broker_url
        self._client: Any = None
        self._lock = threading.Lock()

    def publish(self, build_id: int, state: str) -> None:
        _hub.publish(build_id)
        if not self.broker_url:
            return
        message = json.dumps({"build": build_id, "state": state})
        with self._lock:
            try:
                if self._client is None:
                    import redis

                    self._client = redis.Redis.from_url(self.broker_url, socket_timeout=2, socket_connect_timeout=2)
                self._client.publish(channel(self.broker_url), message)
            except Exception as exc:  # the broker blipping must not fail a build
                log.warning("build %s: could not publish its %s event: %s", build_id, state, exc)
                self._drop()

    def _drop(self) -> None:
        try:
            if self._client is not None:
                self._client.close()
        except Exception:
            pass
        self._client = None

    def close(self) -> None:
        with self._lock:
            self._drop()


class Subscription:
    """Wait for events about some builds. Enter it before reading their state.

    ``wait(build_ids, timeout)`` returns True as soon as an event names one of ``build_ids``
    (or, with ``build_ids=None``, any build), False after ``timeout`` seconds without one. With a
    broker the Redis channel is read; without one (or when subscribing failed) the events of this
    process. A dropped Redis connection is reported as an event (read the state again) and
    re-subscribed on the next wait.
    """

    def __init__(self, broker_url: str | None):
        self.broker_url = broker_url
        self._pubsub: Any = None
        self._client: Any = None
        self._seq = _hub.seq
        self.wakeups = 0  # events that returned True (tests and bench count them)

    def __enter__(self) -> Subscription:
        self._subscribe()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _subscribe(self) -> bool:
        if not self.broker_url:
            return False
        try:
            import redis

            self._client = redis.Redis.from_url(self.broker_url, socket_timeout=30, socket_connect_timeout=3)
            self._pubsub = self._client.pubsub()
            self._pubsub.subscribe(channel(self.broker_url))
            # Only once the server confirms is every later PUBLISH ours: wait for it, so an event
            # that follows our read of the state can't be missed.
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                msg = self._pubsub.get_message(timeout=deadline - time.monotonic())
                if msg is not None and msg.get("type") == "subscribe":
                    return True
            raise TimeoutError("no subscribe confirmation within 3 s")
        except Exception as exc:
            log.warning("cannot subscribe to build events on the broker (%s): polling instead", exc)
            self.close()
            return False

    def close(self) -> None:
        for thing in (self._pubsub, self._client):
            try:
                if thing is not None:
                    thing.close()
            except Exception:
                pass
        self._pubsub = self._client = None

    def wait(self, build_ids: Collection[int] | None, timeout: float) -> bool:
        wanted = None if build_ids is None else set(build_ids)
        if self._pubsub is None and self.broker_url:
            if self._subscribe():
                self.wakeups += 1
                return True  # (re)subscribed: what happened meanwhile is unknown, read again
        if self._pubsub is not None:
            hit = self._wait_redis(wanted, timeout)
        else:
            hit = self._wait_local(wanted, timeout)
        if hit:
            self.wakeups += 1
        return hit

    def next_events(self, timeout: float) -> set[int] | None:
        """The builds named by the events that came within ``timeout`` seconds (the first one and
        any right behind it; empty: none came), or None when what happened is unknown (a dropped
        or renewed subscription, local events dropped): then every waiter reads again."""
        if self._pubsub is None and self.broker_url:
            if self._subscribe():
                self.wakeups += 1
                return None
        if self._pubsub is None:
            with _hub.cond:
                seq, ids = _hub.since(self._seq)
                if ids is not None and not ids:
                    _hub.cond.wait(max(timeout, 0.0))
                    seq, ids = _hub.since(self._seq)
                self._seq = seq
        else:
            ids = set()
            try:
                msg = self._pubsub.get_message(timeout=max(timeout, 0.0))
                while msg is not None:  # the first one, then only what is already there
                    if msg.get("type") == "message":
                        try:
                            ids.add(int(json.loads(msg["data"])["build"]))
                        except (ValueError, KeyError, TypeError):
                            pass
                    msg = self._pubsub.get_message(timeout=0.0)
            except Exception as exc:
                log.warning("build event subscription lost (%s): reading the state again", exc)
                self.close()
                ids = None
        if ids is None or ids:
            self.wakeups += 1
        return ids

    def _wait_redis(self, wanted: set[int] | None, timeout: float) -> bool:
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                msg = self._pubsub.get_message(timeout=left)
            except Exception as exc:
                log.warning("build event subscription lost (%s): reading the state again", exc)
                self.close()
                return True
            if msg is None or msg.get("type") != "message":
                continue
            try:
                build_id = int(json.loads(msg["data"])["build"])
            except (ValueError, KeyError, TypeError):
                continue
            if wanted is None or build_id in wanted:
                return True

    def _wait_local(self, wanted: set[int] | None, timeout: float) -> bool:
        deadline = time.monotonic() + max(timeout, 0.0)
        with _hub.cond:
            while True:
                seq, ids = _hub.since(self._seq)
                self._seq = seq
                if ids is None or (ids and (wanted is None or ids & wanted)):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                _hub.cond.wait(left)
