"""Long polls without threads (farm.api.longpoll): the caps, and what ends a wait (a build
event, the client hanging up, the release done), with the release's status faked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from farm.api import longpoll
from farm.api.longpoll import LongPolls
from farm.core.errors import RateLimitedError
from farm.core.settings import Settings
from farm.pipeline.events import Publisher
from farm.pipeline.plan import ReleaseStatus


def _status(state: str, build: int = 7) -> ReleaseStatus:
    return ReleaseStatus(release_id=1, model="m", builds=[{"build": build, "state": state}])


class Scripted:
    """The release status read by read N: the last one repeats."""

    def __init__(self, *states: str):
        self.states, self.reads = list(states), 0

    def __call__(self, _release_id: int) -> ReleaseStatus:
        self.reads += 1
        return _status(self.states[min(self.reads, len(self.states)) - 1])


@pytest.fixture
def polls(tmp_path: Path) -> Any:
    p = LongPolls(Settings.from_env({"FARM_HOME": str(tmp_path)}), None, max_waiters=3,  # type: ignore[arg-type]
                  max_per_token=2)
    yield p
    p.close()


async def _never() -> None:
    await asyncio.Event().wait()


def test_caps_per_token_and_in_all(polls: LongPolls) -> None:
    with polls.slot("a"), polls.slot("a"):
        with pytest.raises(RateLimitedError, match="this token has 2"):
            with polls.slot("a"):
                pass
        with polls.slot("b"):
            assert polls.count() == 3
            with pytest.raises(RateLimitedError, match="3 long polls are waiting"):
                with polls.slot("c"):
                    pass
    assert polls.count() == 0 and not polls.waiting


def test_a_build_event_ends_the_wait(polls: LongPolls, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Scripted("queued", "queued", "running")
    monkeypatch.setattr(polls, "_status", script)

    async def run() -> ReleaseStatus:
        task = asyncio.ensure_future(polls.watch(1, 3600, "tok", _never))
        while polls.count() == 0 or script.reads < 2:
            await asyncio.sleep(0.01)
        assert not task.done()
        Publisher(None).publish(7, "running")  # what the executor does after its commit
        return await asyncio.wait_for(task, 60)  # a guard: the wait asked for was an hour

    st = asyncio.run(run())
    assert st.builds[0]["state"] == "running" and script.reads == 3
    assert polls.count() == 0


def test_the_client_hanging_up_ends_the_wait(polls: LongPolls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polls, "_status", Scripted("queued"))

    async def run() -> ReleaseStatus:
        gone = asyncio.Event()
        task = asyncio.ensure_future(polls.watch(1, 3600, "tok", gone.wait))
        while polls.count() == 0:
            await asyncio.sleep(0.01)
        gone.set()
        return await asyncio.wait_for(task, 60)

    assert asyncio.run(run()).builds[0]["state"] == "queued"
    assert polls.count() == 0


def test_a_done_release_answers_at_once_and_takes_no_slot(polls: LongPolls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(polls, "_status", Scripted("succeeded"))
    polls.max_waiters = 0
    st = asyncio.run(polls.watch(1, 3600, "tok", _never))
    assert st.done and st.ok


def test_a_lost_event_costs_one_fallback_poll(polls: LongPolls, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(longpoll, "FALLBACK_POLL_S", 0.05)
    script = Scripted("queued", "queued", "queued", "failed")
    monkeypatch.setattr(polls, "_status", script)
    st = asyncio.run(asyncio.wait_for(polls.watch(1, 3600, "tok", _never), 60))
    assert st.done and not st.ok and script.reads == 4


def test_a_waiter_is_woken_by_events_of_its_own_builds_only() -> None:
    """Six pipelines wait at once: an event about one release's build wakes that release's
    waiters (a SQL read each), not every waiter; an event of unknown scope wakes all."""
    feed = longpoll.BuildFeed(None)

    async def run() -> list[list[bool]]:
        mine, other, anyone = feed.listen(frozenset({7, 8})), feed.listen(frozenset({9})), feed.listen()
        seen = []
        for ids in ({8}, {9}, {42}, None):
            for t in (mine, other, anyone):
                t.event.clear()
            feed._wake(ids)
            await asyncio.sleep(0.01)  # the wake-ups are scheduled on this loop
            seen.append([t.event.is_set() for t in (mine, other, anyone)])
        return seen

    try:
        assert asyncio.run(run()) == [[True, False, True], [False, True, True], [False, False, True],
                                      [True, True, True]]
    finally:
        feed.close()
