from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect
from sqlalchemy.exc import IntegrityError

import registry.models  # noqa: F401  (registers the tables on the metadata)
from registry.db import MIGRATIONS_DIR, SCHEMA_HEAD, Database, alembic_config, current_revision, metadata
from registry.models import Model
from tests.common.index_rows import digest


def test_schema_head_is_alembic_head():
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert ScriptDirectory.from_config(cfg).get_heads() == [SCHEMA_HEAD]


def test_models_and_migrations_do_not_drift(db):
    assert current_revision(db.engine) == SCHEMA_HEAD
    with db.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, metadata)
    assert diff == []


def test_every_table_is_migrated(db):
    tables = set(inspect(db.engine).get_table_names())
    assert set(metadata.tables) <= tables
    assert "alembic_version" in tables


def test_reopening_is_a_no_op(tmp_path):
    url = "sqlite:///" + str(tmp_path / "sub" / "i.db")  # the directory is created
    Database(url).dispose()
    again = Database(url)
    assert current_revision(again.engine) == SCHEMA_HEAD
    again.dispose()


def test_fresh_database_without_upgrade_has_no_revision(tmp_path):
    db = Database("sqlite:///" + str(tmp_path / "i.db"), check=False)
    assert current_revision(db.engine) is None
    db.dispose()


def test_downgrade_and_upgrade_again(db):
    command.downgrade(alembic_config(db.engine), "base")
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    command.upgrade(alembic_config(db.engine), "head")
    assert current_revision(db.engine) == SCHEMA_HEAD


def test_digest_shape_is_checked_by_the_database(db):
    with pytest.raises(IntegrityError), db.session() as s:
        s.add(Model(digest="sha256:short", onnx_digest=digest("x"), size=1, files=[], first_name="x"))


def test_session_rolls_back_on_error(db):
    with pytest.raises(RuntimeError), db.session() as s:
        s.add(Model(digest=digest("kept?"), onnx_digest=digest("x"), size=1, files=[], first_name="x"))
        s.flush()
        raise RuntimeError("boom")
    with db.session() as s:
        assert s.get(Model, digest("kept?")) is None


def test_sqlite_pragmas(db):
    with db.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_the_switch_to_wal_waits_out_a_lock_sqlite_answers_at_once():
    """Two connections switching a fresh file to WAL at once: SQLite answers one of them
    "database is locked" at once, past the busy timeout (waiting could deadlock). The switch is
    tried again until the file is in WAL (here switched by the other connection); any other
    error, or a lock that outlasts the tries, still raises."""
    import sqlite3

    from registry.db import _switch_to_wal

    class Cursor:
        def __init__(self, locked: int, then: str = "wal", error: str = "database is locked"):
            self.locked, self.then, self.error, self.calls = locked, then, error, []

        def execute(self, sql: str) -> Cursor:
            self.calls.append(sql)
            if sql == "PRAGMA journal_mode=WAL" and self.locked:
                self.locked -= 1
                raise sqlite3.OperationalError(self.error)
            return self

        def fetchone(self) -> tuple[str]:
            return (self.then,)

    cur = Cursor(locked=1, then="wal")
    _switch_to_wal(cur)  # the other connection switched it meanwhile
    assert cur.calls == ["PRAGMA journal_mode=WAL", "PRAGMA journal_mode"]
    cur = Cursor(locked=3, then="delete")
    _switch_to_wal(cur)
    assert cur.calls.count("PRAGMA journal_mode=WAL") == 4
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _switch_to_wal(Cursor(locked=1, error="disk I/O error"))
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _switch_to_wal(Cursor(locked=5, then="delete"), tries=3)
