"""One PostgreSQL connection of the running event loop, for reads a request awaits without a
thread hop (resolve's generation read, the token revocation version)."""

from __future__ import annotations

import asyncio
from typing import Any


class LoopConnection:
    """A psycopg ``AsyncConnection`` (autocommit) of the loop that opened it: opened once behind
    a lock at first use, opened anew on another loop (a test's app served again) or after it
    broke, closed only on its own loop."""

    def __init__(self, conninfo: str | None):
        self.conninfo = conninfo
        self.conn: Any = None
        self.loop: Any = None
        self.opening: asyncio.Lock | None = None

    async def _connection(self) -> Any:
        import psycopg

        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.conn, self.loop, self.opening = None, loop, asyncio.Lock()
        if self.conn is None or self.conn.closed:
            assert self.opening is not None and self.conninfo is not None
            async with self.opening:
                if self.conn is None or self.conn.closed:
                    self.conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                                      connect_timeout=5)
        return self.conn

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and self.loop is asyncio.get_running_loop():
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass
