"""registry.lite (a bare DB-API connection for the CLI's fast paths) and registry.reads (the
plain-SQL reads it and the service share): the same answers as the ORM, on a schema made by the
migrations, and no connection at all where only the full path may answer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy.engine import make_url

from farm.core.catalog import parse_target
from farm.core.errors import FarmError
from registry.db import Database, alembic_config, current_revision
from registry.index import record_verdict, resolve_model_ref, set_tag
from registry.lite import SCHEMA_HEAD, LiteIndex, SessionRows, open_index, pyformat, sqlite_file
from registry.reads import builds_by_key, candidates, model_ref_hit, models_by_onnx, signatures
from registry.resolve import Device, resolve
from tests.common.index_rows import add_artifact, add_model, digest, spec


def url_of(db: Database) -> str:
    return db.url


@pytest.mark.parametrize("url", ["sqlite:////abs/dir/index.db", "sqlite:///rel/index.db", "sqlite+pysqlite:////a b/i.db",
                                 "sqlite:///:memory:", "sqlite://", "sqlite:////x.db?timeout=5"])
def test_sqlite_file_reads_urls_as_sqlalchemy_does(url: str) -> None:
    expected = make_url(url).database
    got = sqlite_file(url)
    if got is None:  # in-memory, or options only the full path interprets
        assert expected in (None, "", ":memory:") or "?" in url
    else:
        assert got == expected


def test_pyformat_leaves_no_named_parameter() -> None:
    assert pyformat("SELECT a FROM t WHERE x = :x AND y IN (:k0, :k1)") == (
        "SELECT a FROM t WHERE x = %(x)s AND y IN (%(k0)s, %(k1)s)")


def test_opens_only_an_index_at_head(tmp_path: Path, db: Database) -> None:
    assert open_index("sqlite:///" + str(tmp_path / "missing.db")) is None
    assert not (tmp_path / "missing.db").exists()  # never created here: first use is the full path's
    assert open_index("sqlite:///:memory:") is None
    sqlite3.connect(tmp_path / "empty.db").close()
    assert open_index("sqlite:///" + str(tmp_path / "empty.db")) is None  # no alembic_version
    index = open_index(url_of(db))
    assert isinstance(index, LiteIndex)
    index.close()
    with db.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")  # newer than this ctxfarm
    assert open_index(url_of(db)) is None
    assert open_index("postgresql://nobody@127.0.0.1:1/x") is None  # unreachable: the full path says so


def test_an_older_schema_is_not_read_and_the_full_path_upgrades_it(tmp_path: Path) -> None:
    url = "sqlite:///" + str(tmp_path / "old.db")
    old = Database(url, check=False)
    command.upgrade(alembic_config(old.engine), "0004")
    assert open_index(url) is None
    Database(url).dispose()  # SQLite, the embedded default: upgraded on first use
    assert current_revision(old.engine) == SCHEMA_HEAD
    old.dispose()
    index = open_index(url)
    assert index is not None
    index.close()


def test_newer_schema_is_still_schema_mismatch(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(FarmError) as info:
        Database(url_of(db))
    assert info.value.code == "schema-mismatch"


def populated(db: Database) -> tuple[str, list[int]]:
    """Models a (tagged vision/a:stable) and b; a built for 2 SoCs x 2 SDKs, with probe verdicts."""
    with db.session() as s:
        m = add_model(s, "model-a", name="a")
        add_model(s, "model-b", name="b")
        set_tag(s, "vision/a", "stable", m.digest)
        arts = [add_artifact(s, m.digest, target=t, toolchain=v)
                for t in ("SM8650", "SM8750") for v in ("2.47.0", "2.51.0")]
        record_verdict(s, arts[1].id, "qnn", "2.49.40", "loads", "probe", None)
        record_verdict(s, arts[0].id, "qnn", "2.49.40", "fails", "probe", "QNN_CONTEXT_ERROR")
        record_verdict(s, arts[0].id, "qnn", "2.51.0", "loads", "rule", None)
        s.flush()
        return m.digest, [a.id for a in arts]


def test_reads_agree_on_a_session_and_on_a_bare_connection(db: Database) -> None:
    model, arts = populated(db)
    index = open_index(url_of(db))
    assert index is not None
    try:
        with db.session() as s:
            for target in ("SM8650", None):
                on_session = candidates(SessionRows(s), model, "qnn", "2.49.40", target)
                assert on_session == candidates(index, model, "qnn", "2.49.40", target)
            assert {a.id for a in on_session} == set(arts)
            probes = {a.id: (a.probe.verdict if a.probe else None) for a in on_session}
            # Only probes for exactly this runtime version count; a rule row is no probe.
            assert probes == {arts[0]: "fails", arts[1]: "loads", arts[2]: None, arts[3]: None}
            assert all(a.created_at is not None and a.created_at.tzinfo is not None for a in on_session)
            assert on_session[0].build.options == spec(model).options
            onnx = digest("model-a.onnx")
            assert models_by_onnx(SessionRows(s), onnx) == models_by_onnx(index, onnx)
            assert [d for d, _ in models_by_onnx(index, onnx)] == [model]
            key = spec(model).build_key
            found = builds_by_key(index, [key, "0" * 64])
            assert list(found) == [key] and found[key].state == "succeeded" and found[key].artifact_status == "active"
            assert signatures(index, "sha256:" + "0" * 64) == []
    finally:
        index.close()


@pytest.mark.parametrize("ref", ["vision/a:stable", "vision/a", "vision/a:nope", "a:stable", "Bad Name!",
                                 "sha256:" + "0" * 64, "0123456", "sha256:abc"])
def test_model_ref_hit_is_resolve_model_ref_where_it_names_a_model(db: Database, ref: str) -> None:
    model, _ = populated(db)
    refs = {ref, model, model[7:20], "sha256:" + model[7:20]}
    index = open_index(url_of(db))
    assert index is not None
    try:
        with db.session() as s:
            for r in refs:
                try:
                    expected: str | None = resolve_model_ref(s, r)
                except FarmError:
                    expected = None
                assert model_ref_hit(index, r) == expected, r
    finally:
        index.close()


@pytest.mark.parametrize(("soc", "runtime"), [("SM8650", "2.51.0"), ("SM8650", "2.49.40"), ("SM8750", "2.47.0"),
                                              ("SM8550", "2.51.0"), ("SM8650", "2.40.0")])
def test_resolve_answers_the_same_on_both(db: Database, soc: str, runtime: str) -> None:
    model, _ = populated(db)
    device = Device("qnn", parse_target(f"qnn:{soc}"), runtime)
    index = open_index(url_of(db))
    assert index is not None
    try:
        with db.session() as s:
            answers: list[object] = []
            for rows in (s, index):
                try:
                    art, v = resolve(rows, model, device)
                    answers.append((art.digest, v, [f.name for f in art.files]))
                except FarmError as exc:
                    answers.append((exc.code, exc.message, exc.hint))
            assert answers[0] == answers[1]
    finally:
        index.close()
