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
