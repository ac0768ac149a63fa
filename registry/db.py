"""Metadata (with a naming convention), engines and sessions, schema upgrade via Alembic."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from farm.core.errors import ConfigError, DatabaseError, FarmError, SchemaMismatchError
from farm.core.placement import file_lock
from registry.lite import SCHEMA_HEAD

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata = MetaData(naming_convention=NAMING)

# SCHEMA_HEAD, the newest migration (a unit test checks it equals Alembic's head), is kept in
# registry.lite, whose fast paths compare the schema revision without importing SQLAlchemy.

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class Base(DeclarativeBase):
    metadata = metadata


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy's documented pysqlite recipe: the driver's own transaction handling is off
    # (isolation_level=None), and "begin" below emits BEGIN IMMEDIATE, so a SAVEPOINT is a real
    # nested transaction and a rollback undoes everything the session wrote.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    # busy_timeout first: the journal-mode switch below can itself meet a lock.
    cur.execute("PRAGMA busy_timeout=30000")
    # WAL lets readers run while a build commits. Switched once, by the connection that finds the
    # file in another mode: asking for WAL again on every new connection can meet another
    # connection's write and answer "database is locked" at once, without the busy timeout (seen
    # on a fresh FARM_HOME, where `farm build --genai` opens connections from several threads).
    mode = cur.execute("PRAGMA journal_mode").fetchone()
    if not mode or str(mode[0]).lower() != "wal":
        _switch_to_wal(cur)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _switch_to_wal(cur: Any, *, tries: int = 100) -> None:
    """``PRAGMA journal_mode=WAL``, tried again while another connection holds the file. The
    switch reads the file (a shared lock) and then needs it alone: SQLite answers "database is
    locked" at once, without the busy timeout, when another connection does the same (two
    threads opening a fresh file at once both find it in rollback mode), since waiting there could
    deadlock. Up to ``tries`` times, 20-120 ms apart (jittered, so the two stop meeting)."""
    import random
    import sqlite3
    import time

    for attempt in range(tries):
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == tries - 1:
                raise
            time.sleep(0.02 + random.random() * 0.1)  # noqa: S311 - jitter, not a secret
            row = cur.execute("PRAGMA journal_mode").fetchone()
            if row and str(row[0]).lower() == "wal":
                return  # the other connection switched it


def _sqlite_begin(conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def sqlite_path(url: str) -> Path | None:
    """The file of a sqlite URL (None for in-memory)."""
    from sqlalchemy.engine import make_url

    db = make_url(url).database
    return Path(db) if db and db != ":memory:" else None


def make_engine(url: str) -> Engine:
    """Engine for a FARM_DATABASE_URL; SQLite files get their directory created."""
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"FARM_DATABASE_URL: cannot create {path.parent}: {exc.strerror}") from None
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    try:
        return create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as exc:
        from farm.core.extras import install_hint

        raise ConfigError(
            f"database driver missing for {url.split(':', 1)[0]}: {exc.name}",
            hint=install_hint("postgres"),
        ) from None


def alembic_config(engine: Engine):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def current_revision(engine: Engine) -> str | None:
    """The schema's revision (the one row of alembic_version), None where Alembic never ran.
    One statement on every open: the table is looked up (reflection) only when that read fails."""
    try:
        with engine.connect() as conn:
            try:
                return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
            except SQLAlchemyError:
                conn.rollback()  # PostgreSQL: the failed statement aborted the transaction
                if inspect(conn).has_table("alembic_version"):
                    raise
                return None
    except SQLAlchemyError as exc:
        raise database_error(exc, engine.url.render_as_string(hide_password=True)) from None


def database_error(exc: BaseException, url: str = "") -> FarmError:
    """A driver error as the user sees it: unreachable, refused, or not a database."""
    orig = getattr(exc, "orig", None) or exc
    text_ = str(orig).strip().splitlines()[0][:300] if str(orig).strip() else type(orig).__name__
    where = f" ({url})" if url else ""
    return DatabaseError(f"index database error{where}: {text_}")


# Every revision up to head (revisions are numbered 0001, 0002, ... in order): an index at one of
# them is older (upgraded), at any other newer. Derived, so a new migration can't be left out.
KNOWN_REVISIONS = tuple(f"{n:04d}" for n in range(1, int(SCHEMA_HEAD) + 1))


def check_schema(engine: Engine, *, auto_upgrade: bool) -> None:
    """Make sure the schema is the one this code was written for.

    SQLite (the embedded default) is upgraded on first use, under a file lock so N commands
    started at once on a fresh FARM_HOME never race. Any other database is never migrated
    implicitly: an older or newer schema is ``schema-mismatch`` naming ``farm db upgrade``.
    """
    rev = current_revision(engine)
    if rev == SCHEMA_HEAD:
        return
    url = engine.url.render_as_string(hide_password=True)
    if rev is not None and rev not in KNOWN_REVISIONS:
        raise SchemaMismatchError(f"the index schema is at {rev}, newer than this ctxfarm (head {SCHEMA_HEAD})",
                                  hint="upgrade ctxfarm on this machine; never run an older one against it")
    if not auto_upgrade or engine.dialect.name != "sqlite":
        raise SchemaMismatchError(
            f"the index schema at {url} is at {rev or 'none'}, this ctxfarm needs {SCHEMA_HEAD}",
            hint="run `farm db upgrade` (once, by an operator) before starting commands and workers")
    path = sqlite_path(str(engine.url))
    with file_lock(path.with_name(path.name + ".lock")) if path else nullcontext():
        if current_revision(engine) != SCHEMA_HEAD:  # someone else may have done it meanwhile
            try:
                upgrade(engine)
            except SQLAlchemyError as exc:
                raise database_error(exc, url) from None


def migrate(url: str) -> None:
    """``farm db upgrade``: bring the schema at ``url`` to head (an operator's explicit step)."""
    engine = make_engine(url)
    try:
        if current_revision(engine) != SCHEMA_HEAD:
            upgrade(engine)
    finally:
        engine.dispose()


class Database:
    """An engine plus a session factory; the schema is checked once when opened."""

    def __init__(self, url: str, *, auto_upgrade: bool = True, check: bool = True):
        self.url = url
        self.engine = make_engine(url)
        if check:
            check_schema(self.engine, auto_upgrade=auto_upgrade)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in a transaction: committed on success, rolled back on error."""
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def serialized(self, what: str, key: int, *, wait: float = 10.0) -> Iterator[None]:
        """One holder at a time of (``what``, ``key``): a check-then-create (a token's quota:
        count its rows, then add one) that two requests must not both pass. PostgreSQL: a
        session advisory lock on a connection of its own, so every process and host of the
        service shares it; SQLite (one process serves it): a lock of this process. Held at most
        ``wait`` s by another: ``RateLimitedError`` (try again), never an unbounded wait."""
        if self.engine.dialect.name != "postgresql":
            with _local_lock(self.url, what, key, wait):
                yield
            return
        import time

        name = f"ctxfarm.{what}"
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            deadline = time.monotonic() + wait
            while not c.scalar(text("SELECT pg_try_advisory_lock(hashtext(:n), :k)"), {"n": name, "k": key}):
                if time.monotonic() > deadline:
                    raise _busy(what)
                time.sleep(0.005)
            try:
                yield
            finally:
                try:
                    c.execute(text("SELECT pg_advisory_unlock(hashtext(:n), :k)"), {"n": name, "k": key})
                except Exception:
                    c.invalidate()  # its session ends, and the lock with it
                    raise

    def dispose(self) -> None:
        self.engine.dispose()


_LOCAL_LOCKS: dict[tuple[str, str, int], Any] = {}


@contextmanager
def _local_lock(url: str, what: str, key: int, wait: float) -> Iterator[None]:
    import threading

    lock = _LOCAL_LOCKS.setdefault((url, what, key), threading.Lock())  # setdefault: atomic under the GIL
    if not lock.acquire(timeout=wait):
        raise _busy(what)
    try:
        yield
    finally:
        lock.release()


def _busy(what: str) -> FarmError:
    from farm.core.errors import RateLimitedError

    return RateLimitedError(f"another request of this token is creating {what} right now",
                            hint="try again in a moment")
