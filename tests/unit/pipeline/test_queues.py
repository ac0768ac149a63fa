"""The broker helpers: a broker check answered from a recent success, and a taken build's message
found and removed from its list (kombu's Redis layout, real messages made by Celery)."""

from __future__ import annotations

from typing import Any

import pytest

from farm.core.errors import NoWorkerError
from farm.pipeline import queues


class FakeApp:
    def __init__(self) -> None:
        self.opened, self.down = 0, False
        self.conf = type("Conf", (), {"broker_url": "redis://nowhere"})()

    def connection_for_write(self) -> Any:
        app = self

        class Conn:
            def __enter__(self) -> Any:
                app.opened += 1
                return self

            def __exit__(self, *exc: object) -> None:
                pass

            def ensure_connection(self, **_: Any) -> None:
                if app.down:
                    raise ConnectionError("refused")

        return Conn()


def test_a_broker_that_just_answered_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("time.monotonic", lambda: now[0])
    app = FakeApp()
    queues.check_broker(app)
    queues.check_broker(app)
    assert app.opened == 1
    now[0] += queues.BROKER_OK_S + 0.01
    app.down = True
    with pytest.raises(NoWorkerError, match="unreachable"):
        queues.check_broker(app)
    with pytest.raises(NoWorkerError):  # a failure is never remembered as an answer
        queues.check_broker(app)
    app.down = False
    queues.check_broker(app)
    assert app.opened == 4


class FakeRedis:
    def __init__(self, items: list[bytes]) -> None:
        self.items = list(items)  # index 0 is the left end (kombu pushes there)

    def lrange(self, _key: str, start: int, end: int) -> list[bytes]:
        n = len(self.items)
        lo = max(n + start, 0) if start < 0 else start
        hi = n + end if end < 0 else end
        return self.items[lo:hi + 1]

    def lrem(self, _key: str, count: int, value: bytes) -> int:
        if value in self.items:
            self.items.remove(value)
            return 1
        return 0


def message(task: str, build_id: int) -> bytes:
    """A message as Celery's Redis transport stores it."""
    import base64
    import json

    body = base64.b64encode(json.dumps([[build_id], {}, {}]).encode()).decode()
    return json.dumps({"body": body, "headers": {"task": task}, "properties": {"body_encoding": "base64"}}).encode()


def test_unlist_takes_only_that_builds_compile_message() -> None:
    items = [message(queues.COMPILE_TASK, 7), message(queues.PROBE_TASK, 5), b"not json",
             message(queues.COMPILE_TASK, 5), message(queues.COMPILE_TASK, 3)]
    r = FakeRedis(items)
    assert queues.unlist(r, "q", 5)
    assert message(queues.COMPILE_TASK, 5) not in r.items and message(queues.PROBE_TASK, 5) in r.items
    assert len(r.items) == 4
    assert not queues.unlist(r, "q", 5)  # gone already (another worker took it): nothing changes
    assert not queues.unlist(r, "q", 99)
    assert len(r.items) == 4
