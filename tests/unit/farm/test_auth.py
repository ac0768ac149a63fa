"""farm.api.auth: a cached token holds only under the revocation version it was read with, and a
version read shared by requests always started after each of them came."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy import create_engine, text

from farm.api.auth import MISS, RevocationVersion, TokenCache
from registry.db import Database
from registry.tokens import create_token, revocation_version, revoke_token


def test_a_cached_token_holds_only_under_its_version() -> None:
    cache = TokenCache(size=2)
    cache.put("cfk_a", (1, "read"), 7)
    cache.put("cfk_unknown", None, 7)
    assert cache.get("cfk_a", 7) == (1, "read") and cache.get("cfk_unknown", 7) is None
    assert cache.get("cfk_a", 8) is MISS and cache.get("cfk_unknown", 8) is MISS  # a token was revoked since
    cache.put("cfk_b", (2, "admin"), 8)
    assert cache.get("cfk_a", 7) is MISS  # bounded: the oldest went


def test_every_revocation_bumps_the_version(tmp_path: Any) -> None:
    db = Database("sqlite:///" + str(tmp_path / "i.db"))
    with db.session() as s:
        before = revocation_version(s)
        create_token(s, "one", "read")
        create_token(s, "two", "report")
    with db.session() as s:
        assert revocation_version(s) == before  # creating one changes nothing cached
        revoke_token(s, "one")
    with db.session() as s:
        assert revocation_version(s) == before + 1
        revoke_token(s, "two")
    version = RevocationVersion(db.engine)
    assert version.read_now() == before + 2
    assert asyncio.run(version.current()) == before + 2  # SQLite: read by a thread
    with db.session() as s:  # a writer holds the lock (a build committing): the read does not wait for it
        s.execute(text("UPDATE token_revocations SET version = version"))
        t0 = time.monotonic()
        assert version.read_now() == before + 2 and time.monotonic() - t0 < 5
    db.dispose()


class GatedReads(RevocationVersion):
    """A unit-test fake of the one read: each read sees ``value`` when it starts and answers when
    the test opens its gate."""

    def __init__(self) -> None:
        super().__init__(create_engine("sqlite://"))
        self.value = 0
        self.started: list[int] = []
        self.gates: list[asyncio.Event] = []

    async def _read(self) -> int:
        seen = self.value
        self.started.append(seen)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return seen


def test_a_request_never_takes_a_read_that_started_before_it_came() -> None:
    async def scenario() -> None:
        v = GatedReads()
        first = asyncio.ensure_future(v.current())
        while not v.started:
            await asyncio.sleep(0)
        v.value = 1  # a revocation commits while the first read is in flight
        later = [asyncio.ensure_future(v.current()) for _ in range(3)]  # requests sent after it
        for _ in range(5):
            await asyncio.sleep(0)
        assert v.started == [0]  # they wait for a read of their own, not the one in flight
        v.gates[0].set()
        assert await first == 0
        while len(v.started) < 2:
            await asyncio.sleep(0)
        v.gates[1].set()
        assert await asyncio.gather(*later) == [1, 1, 1]
        assert v.started == [0, 1]  # the three came during one read: they shared the next

    asyncio.run(scenario())


def test_a_failed_read_fails_only_the_requests_that_waited_on_it() -> None:
    class Failing(GatedReads):
        async def _read(self) -> int:
            if not self.started:
                self.started.append(-1)
                raise RuntimeError("the database went away")
            return await super()._read()

    async def scenario() -> None:
        v = Failing()
        try:
            await v.current()
        except RuntimeError as exc:
            assert "went away" in str(exc)
        else:
            raise AssertionError("the failed read answered")
        nxt = asyncio.ensure_future(v.current())
        while len(v.started) < 2:
            await asyncio.sleep(0)
        v.gates[0].set()
        assert await nxt == 0

    asyncio.run(scenario())
