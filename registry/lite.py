"""The index over a bare DB-API connection, for the CLI's hot paths, and the one ``Rows`` interface
the plain-SQL reads (``registry.reads``) run on.

``farm resolve`` and a cached ``farm build`` must answer from the shell in less time than
SQLAlchemy takes to import (about 250 ms of CPU here; psycopg 3 about 120 ms). So these paths
open the index with the driver itself (sqlite3; psycopg2 when installed, else psycopg) and
run plain SQL. The service runs the same SQL text on its SQLAlchemy session (``SessionRows``):
one implementation of each read, two ways to reach the database.

``open_index`` returns a connection only where it can answer exactly as the full path would:
an existing SQLite file, or a PostgreSQL server that answers, whose schema is this ctxfarm's
head, read from ``alembic_version`` (one row, no reflection, no Alembic). Anything else -- a
fresh FARM_HOME, an older or newer schema, an unreachable server, a missing driver -- gives
None, and the caller takes the full path (``registry.db.Database``), which creates and upgrades
a SQLite index under its lock, or raises ``schema-mismatch`` or the database error with its hint.

Reads run in one read-only transaction, so the statements of one answer see one snapshot
(SQLite: a deferred BEGIN in WAL mode; PostgreSQL: REPEATABLE READ READ ONLY, sent with BEGIN).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Protocol

# The newest migration; a unit test checks it equals Alembic's head so this never drifts.
# (Here, not in registry.db, so the fast paths can compare without importing SQLAlchemy.)
SCHEMA_HEAD = "0021"


class Rows(Protocol):
    """Runs one SQL statement with ``:name`` parameters and returns its rows as tuples."""

    dialect: str  # "sqlite" | "postgresql"

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]: ...


_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=256)
def pyformat(sql: str) -> str:
    """``:name`` -> ``%(name)s`` for the PostgreSQL drivers (sqlite3 takes ``:name`` as is). The
    SQL given here never holds a literal ``%`` or ``::`` cast: values travel as parameters."""
    return _NAMED.sub(r"%(\1)s", sql)


def in_params(prefix: str, values: list[Any]) -> tuple[str, dict[str, Any]]:
    """``IN (...)`` for a list: the placeholders and their parameters (``values`` non-empty)."""
    names = [f"{prefix}{i}" for i in range(len(values))]
    return ", ".join(f":{n}" for n in names), dict(zip(names, values, strict=True))


def as_json(value: Any) -> Any:
    """A JSON column: PostgreSQL drivers parse ``json``; SQLite hands back the text."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def as_datetime(value: Any) -> datetime | None:
    """A DateTime(timezone=True) column, always aware (UTC): SQLite stores naive text."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class SessionRows:
    """``Rows`` on a SQLAlchemy session: the statement goes to the driver as written (no ORM, no
    SQL compilation), inside the session's transaction."""

    def __init__(self, session: Any):
        self.session = session
        self.dialect = session.get_bind().dialect.name

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        stmt = sql if self.dialect == "sqlite" else pyformat(sql)
        result = self.session.connection().exec_driver_sql(stmt, dict(params or {}))
        if not result.returns_rows:
            return []
        # The driver's own tuples: SQLAlchemy's Row objects cost more than the statement for a
        # few thousand rows (a coverage page), and the callers index by position anyway.
        try:
            return list(result.cursor.fetchall())
        finally:
            result.close()


class ConnectionRows:
    """``Rows`` on a SQLAlchemy Connection: with an autocommit connection, one round trip per
    statement (no BEGIN / COMMIT), each statement seeing what is committed when it runs."""

    def __init__(self, conn: Any):
        self.conn = conn
        self.dialect = conn.dialect.name

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        result = self.conn.exec_driver_sql(sql if self.dialect == "sqlite" else pyformat(sql), dict(params or {}))
        if not result.returns_rows:
            return []
        try:
            return list(result.cursor.fetchall())
        finally:
            result.close()


def rows_of(source: Any) -> Rows:
    """A ``Rows`` for a SQLAlchemy session, or the ``Rows`` itself."""
    return source if hasattr(source, "rows") else SessionRows(source)


class LiteIndex:
    """A DB-API connection to the index, in one read-only transaction until ``close``."""

    def __init__(self, conn: Any, dialect: str):
        self.conn = conn
        self.dialect = dialect

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        cur = self.conn.cursor()
        try:
            cur.execute(sql if self.dialect == "sqlite" else pyformat(sql), dict(params or {}))
            return [tuple(r) for r in cur.fetchall()] if cur.description is not None else []
        finally:
            cur.close()

    def commit(self) -> None:
        """Keep what this transaction wrote (an index opened with ``write=True``)."""
        if self.dialect == "sqlite":
            self.conn.execute("COMMIT")
        else:
            self.conn.commit()

    def close(self) -> None:
        try:
            self.conn.rollback()  # nothing committed is kept: a read, or a write given up
        finally:
            self.conn.close()

    def __enter__(self) -> LiteIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sqlite_file(url: str) -> str | None:
    """The file of a plain ``sqlite:///PATH`` URL (as SQLAlchemy reads it); None for in-memory
    databases and URLs with query options, which only the full path interprets."""
    m = re.fullmatch(r"sqlite(\+\w+)?:///(.+)", url)
    if m is None or "?" in url or m.group(2) == ":memory:":
        return None
    return m.group(2)


def open_index(url: str, *, driver: str | None = None, write: bool = False) -> LiteIndex | None:
    """A read-only connection to the index at ``url`` whose schema is at ``SCHEMA_HEAD``, or None
    when only the full path can answer (see the module docstring). ``driver`` forces
    ``psycopg2`` or ``psycopg`` for PostgreSQL (tests). ``write``: one read-write transaction
    instead (SQLite: ``BEGIN IMMEDIATE``, the write lock taken before the first read; PostgreSQL:
    read committed, as the full path's sessions), kept only by ``commit``."""
    try:
        index = _connect(url, driver, write)
    except Exception:  # noqa: BLE001 - any failure here is the full path's to report, with its hint
        return None
    if index is None:
        return None
    try:
        found = index.rows("SELECT version_num FROM alembic_version")
    except Exception:  # noqa: BLE001 - no alembic_version table: a database the full path sets up
        found = []
    if [r[0] for r in found] != [SCHEMA_HEAD]:
        index.close()
        return None
    return index


def _connect(url: str, driver: str | None, write: bool = False) -> LiteIndex | None:
    if url.startswith("sqlite"):
        import os
        import sqlite3
        from urllib.parse import quote

        path = sqlite_file(url)
        if path is None or not os.path.isfile(path):
            return None  # first use: the full path creates it under its lock
        # mode=rw: never create a file here; the busy timeout matches registry.db's.
        conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=rw", uri=True, timeout=30.0,
                               isolation_level=None)
        try:
            # Deferred: the first read takes the snapshot (WAL). A writer takes the lock first, so
            # its reads and its write see the same database.
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        except BaseException:
            conn.close()
            raise
        return LiteIndex(conn, "sqlite")
    m = re.fullmatch(r"postgresql(\+\w+)?://(.*)", url, re.DOTALL)
    if m is None:
        return None
    dsn = "postgresql://" + m.group(2)
    if driver in (None, "psycopg2"):
        try:
            import psycopg2
        except ImportError:
            if driver == "psycopg2":
                raise
        else:
            # psycopg2 imports in about a quarter of psycopg 3's time: the CLI's budget.
            pg2 = psycopg2.connect(dsn)
            if not write:
                pg2.set_session(isolation_level="REPEATABLE READ", readonly=True)
            return LiteIndex(pg2, "postgresql")
    import psycopg

    pg = psycopg.connect(dsn)
    if not write:
        pg.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        pg.read_only = True
    return LiteIndex(pg, "postgresql")
