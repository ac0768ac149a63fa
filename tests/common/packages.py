"""Fakes for ORT model packages a worker makes (farm.pipeline.package_jobs): a ``PackageBoard``
in memory, and a dispatch that records what it was asked to send."""

from __future__ import annotations

import threading
from typing import Any


class InMemoryPackageBoard:
    """The board's claims and failures in dicts (TTLs recorded, not enforced: ``expire`` drops
    one as its TTL would)."""

    def __init__(self) -> None:
        self.claims: dict[str, float] = {}
        self.failures: dict[str, tuple[dict[str, Any], float]] = {}
        self.lock = threading.Lock()
        self.closed = False

    def claim(self, key: str, ttl: float) -> bool:
        with self.lock:
            if key in self.claims:
                return False
            self.claims[key] = ttl
            return True

    def making(self, key: str) -> bool:
        return key in self.claims

    def failure(self, key: str) -> dict[str, Any] | None:
        got = self.failures.get(key)
        return None if got is None else dict(got[0])

    def finish(self, key: str, error: dict[str, Any] | None, ttl: float) -> None:
        with self.lock:
            if error is not None:
                self.failures[key] = (dict(error), ttl)
            self.claims.pop(key, None)

    def expire(self, key: str) -> None:
        self.failures.pop(key, None)
        self.claims.pop(key, None)

    def close(self) -> None:
        self.closed = True


class RecordingDispatch:
    """A dispatch that keeps (args, queue) per message; ``then`` (if set) runs on each, in a
    thread when ``later`` is set (a worker answering after a while)."""

    def __init__(self, then: Any = None, later: float | None = None, fail: BaseException | None = None):
        self.sent: list[tuple[list[Any], str]] = []
        self.then, self.later, self.fail = then, later, fail

    def __call__(self, args: list[Any], queue: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.sent.append((list(args), queue))
        if self.then is None:
            return
        if self.later is None:
            self.then(*args)
        else:
            threading.Timer(self.later, self.then, args).start()
