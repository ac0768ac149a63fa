"""Which token sent a request, as of the moment the request arrived: (id, scope), or None for an
unknown or revoked token.

Each service process keeps what it looked up (``TokenCache``), and trusts an entry only while the
revocation version it reads for the request is the one the entry was read under. Every revocation
bumps that version in its own transaction (``registry.tokens.revoke_token``), so once `farm token
revoke` returns, every process of the service (any worker, any host) refuses the token: the next
request each one answers reads the new version and looks the token up again.

The version is a one-row read (``RevocationVersion``). On PostgreSQL each process reads it on its
event loop over a connection of its own, no thread hop; requests that come while a read is in
flight share the next read, which starts after they came (so it sees every revocation committed
before they were sent): under load a process sends one read per batch of requests, not one each.
On SQLite (one service process; the CLI revokes from another) a thread reads it."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections import OrderedDict
from typing import Any

from farm.api.loopconn import LoopConnection

MISS = object()
Identity = tuple[int, str]  # (token id, scope)


class TokenCache:
    """sha256(token) -> (identity or None, the revocation version it was read under): a device's
    resolve and its blob GETs cost one token lookup, not one each. Bounded in size (least
    recently stored go first)."""

    def __init__(self, size: int = 10_000):
        self.size = size
        self.items: OrderedDict[str, tuple[int, Identity | None]] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def _key(token: str) -> str:
        return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()

    def get(self, token: str, version: int) -> Any:
        """The identity cached for ``token`` under ``version``, else ``MISS``."""
        with self.lock:
            hit = self.items.get(self._key(token))
        if hit is None or hit[0] != version:
            return MISS
        return hit[1]

    def put(self, token: str, identity: Identity | None, version: int) -> None:
        with self.lock:
            self.items[self._key(token)] = (version, identity)
            if len(self.items) > self.size:
                self.items.popitem(last=False)


class RevocationVersion(LoopConnection):
    """The revocation version (``registry.tokens.VERSION_SQL``) as read now: ``current`` on the
    event loop (coalesced, see the module), ``read_now`` from any thread (the registry's engine)."""

    def __init__(self, engine: Any):
        super().__init__(engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                         if engine is not None and engine.dialect.name == "postgresql" else None)
        self.engine = engine
        self.next: asyncio.Future[int] | None = None  # the read the requests that came since the last one wait for
        self.task: asyncio.Task[None] | None = None

    def read_now(self) -> int:
        from sqlalchemy import text

        from registry.tokens import VERSION_SQL

        if self.engine.dialect.name == "sqlite":
            # The driver's own connection, in autocommit: a plain WAL read. Through the engine the
            # read would open with BEGIN IMMEDIATE (registry.db), the writers' lock, on every request.
            from registry.db import database_error

            conn = self.engine.raw_connection()
            try:
                row = conn.driver_connection.execute(VERSION_SQL).fetchone()  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - sqlite3's error, as every database error is shown
                raise database_error(exc) from None
            finally:
                conn.close()
            return int(row[0]) if row else 0
        with self.engine.connect() as c:
            return int(c.execute(text(VERSION_SQL)).scalar() or 0)

    async def current(self) -> int:
        """The version read by a statement that started after this call: a request that comes
        while a read is in flight waits for the next one (shared by all that came meanwhile)."""
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # a new loop (a test's app served again): its own connection and reads
            self.loop, self.conn, self.opening, self.next, self.task = loop, None, asyncio.Lock(), None, None
        if self.next is None:
            self.next = loop.create_future()
            if self.task is None:
                self.task = loop.create_task(self._reads())
        return await asyncio.shield(self.next)

    async def _reads(self) -> None:
        fut = None
        try:
            while self.next is not None:
                # Every request waiting on ``fut`` came before this point: the read starts after them.
                fut, self.next = self.next, None
                try:
                    fut.set_result(await self._read())
                except Exception as exc:  # noqa: BLE001 - each waiting request raises it
                    fut.set_exception(exc)
                    fut.exception()  # retrieved: no "never retrieved" log when no request waits any more
        except BaseException:  # cancelled (the loop closing): no request waits for ever
            for f in (fut, self.next):
                if f is not None and not f.done():
                    f.cancel()
            self.next = None
            raise
        finally:
            self.task = None

    async def _read(self) -> int:
        from starlette.concurrency import run_in_threadpool

        if self.conninfo is None:
            return await run_in_threadpool(self.read_now)
        from registry.tokens import VERSION_SQL

        try:
            conn = await self._connection()
            cur = await conn.execute(VERSION_SQL)
            row = await cur.fetchone()
            return int(row[0]) if row else 0
        except Exception:  # noqa: BLE001 - the engine reads it instead, or raises what is wrong
            await self.close()
            return await run_in_threadpool(self.read_now)

    async def open(self) -> None:
        """PostgreSQL: the connection opened now (at start), not by the first request."""
        if self.conninfo is None:
            return
        try:
            await self.current()
        except Exception:  # noqa: BLE001 - the first request reads it, and says what is wrong
            pass


def _lookup(state: Any, raw: str, version: int) -> Identity | None:
    from registry.tokens import token_identity

    with state.registry.db.session() as s:
        found = token_identity(s, raw)
    got = None if found is None else (found[0], found[2])
    state.tokens.put(raw, got, version)
    return got


async def identity(state: Any, raw: str) -> Identity | None:
    """(id, scope) of token ``raw`` as of now (None: unknown or revoked), on the event loop: a
    version read, and a database lookup (in a thread) only when the cache has no entry under it."""
    from starlette.concurrency import run_in_threadpool

    version = await state.revocations.current()
    got = state.tokens.get(raw, version)
    if got is MISS:
        got = await run_in_threadpool(_lookup, state, raw, version)
    return got  # type: ignore[no-any-return]


def identity_now(state: Any, raw: str) -> Identity | None:
    """``identity`` from a thread (a sync dependency)."""
    version = state.revocations.read_now()
    got = state.tokens.get(raw, version)
    return _lookup(state, raw, version) if got is MISS else got  # type: ignore[no-any-return]
