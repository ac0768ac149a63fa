"""The report writer's batch statement on SQLite and PostgreSQL: the same ids, counts
and strikes whichever dialect (PostgreSQL writes the batch as one ``unnest`` statement, SQLite as
one multi-row INSERT), through ``ReportWriter`` from an event loop as the service uses it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from registry.db import Database, migrate
from registry.reports import ReportWriter, record_many, summary
from registry.tokens import create_token, revoke_token
from tests.common.index_rows import add_artifact, add_model

pytestmark = pytest.mark.integration

FIELDS = {"device_model": "Phone", "soc": "SM8650", "os": "Android", "arch": "aarch64", "runtime_backend": "qnn",
          "runtime_version": "2.51.0", "ort_version": "1.31.1", "outcome": "loads", "load_ms": 10.0}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = request.getfixturevalue("pg_url") if request.param == "postgresql" else f"sqlite:///{tmp_path / 'index.db'}"
    if request.param == "sqlite":
        migrate(url)
    database = Database(url)
    yield database
    database.dispose()


def _setup(db: Database) -> tuple[int, int, int]:
    with db.session() as s:
        a = add_artifact(s, add_model(s).digest)
        create_token(s, "live", "report")
        create_token(s, "gone", "report")
        ids = dict(s.execute(text("SELECT name, id FROM api_tokens")).all())
        return a.id, ids["live"], ids["gone"]


def test_a_batch_collapses_replays_counts_them_and_strikes_a_revoked_token(db: Database) -> None:
    artifact, live, gone = _setup(db)
    with db.session() as s:
        revoke_token(s, "gone")
    with db.session() as s:
        ids = record_many(s, [(artifact, live, {**FIELDS, "device_id": "d1", "load_ms": 20.0}),
                              (artifact, live, {**FIELDS, "device_id": "d1", "load_ms": 30.0}),  # a replay
                              (artifact, gone, {**FIELDS, "device_id": "d2", "reported_at": None}),
                              (artifact, live, {**FIELDS, "device_id": "d3", "outcome": "fails", "error": "QNN_X",
                                                "load_ms": None})])
    assert ids[0] == ids[1] and len(set(ids)) == 3
    with db.session() as s:
        rows = {r[0]: r[1:] for r in s.execute(text(
            "SELECT device_id, count, load_ms, revoked_at IS NOT NULL, revoked_why FROM device_reports"))}
        assert rows["d1"] == (2, 30.0, False, None)  # the last of the replays, counted twice
        assert rows["d2"][2:] == (True, "token revoked")  # stored struck: it never counts
        assert rows["d3"][:3] == (1, None, False)
        (entry,) = summary(s, [artifact])[artifact]
        assert (entry["devices"], entry["loads"], entry["fails"]) == (2, 1, 1)
    with db.session() as s:  # the same device again: replaced, counted, still live
        (again,) = record_many(s, [(artifact, live, {**FIELDS, "device_id": "d1"})])
        assert again == ids[0]
        assert s.execute(text("SELECT count FROM device_reports WHERE device_id = 'd1'")).scalar() == 3


def test_the_writer_answers_each_request_its_row_once_committed(db: Database) -> None:
    artifact, live, _gone = _setup(db)
    writer = ReportWriter(db)

    async def many() -> list[int]:
        return list(await asyncio.gather(*(writer.write(artifact, live, {**FIELDS, "device_id": f"d{i % 40}"})
                                           for i in range(120))))

    ids = asyncio.run(many())
    assert len(set(ids)) == 40  # 40 devices, each reported 3 times
    with db.session() as s:
        assert s.execute(text("SELECT count(*), sum(count) FROM device_reports")).one() == (40, 120)

    async def bad() -> None:  # a row the database refuses fails its own request only
        ok = writer.write(artifact, live, {**FIELDS, "device_id": "fine"})
        broken = writer.write(artifact + 10_000, live, {**FIELDS, "device_id": "orphan"})  # no such artifact
        got = await asyncio.gather(ok, broken, return_exceptions=True)
        assert isinstance(got[0], int) and isinstance(got[1], Exception)

    asyncio.run(bad())
