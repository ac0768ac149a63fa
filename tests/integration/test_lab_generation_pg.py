"""Device lab reports move a model's resolve generation on PostgreSQL (the trigger function of
migrations 0017 and 0020): a report accepted, struck (its device revoked) or deleted bumps the
generation of its artifact's model once, through the SQL function ``model_generation_bump()``
the artifacts' and verdicts' triggers call; downgraded to 0019 the trigger keeps bumping with
0017's own statement, and upgraded again it calls the function."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from registry.db import Database, alembic_config, current_revision, make_engine
from registry.devices import revoke_device
from registry.lite import SCHEMA_HEAD
from registry.verification import ensure_jobs
from tests.common.index_rows import add_artifact, add_model
from tests.common.lab import enroll_device, report_next

FIGURES = {"p50_ms": 30.0, "psnr_db": 60.0, "load_ms": 100.0}


def _generation(db: Database, model: str) -> int:
    with db.session() as s:
        return int(s.execute(text("SELECT generation FROM model_generations WHERE model_digest = :m"),
                             {"m": model}).scalar() or 0)


def _trigger_body(db: Database) -> str:
    with db.session() as s:
        return str(s.execute(text("SELECT prosrc FROM pg_proc WHERE proname = 'device_lab_generation_trigger'"))
                   .scalar_one())


def _report_strike_delete(db: Database, label: str) -> list[int]:
    """A model with one SM8650 artifact and a job; an enrolled phone reports on it, is revoked
    (its report struck), and the report row is deleted: the model's generation after each."""
    with db.session() as s:
        model = add_model(s, label, name=label).digest
        art = add_artifact(s, model)
        ensure_jobs(s, art.id, "SM8650", 1)
        phone = enroll_device(s, f"phone-{label}")
    seen = [_generation(db, model)]
    with db.session() as s:
        got, row = report_next(s, phone, {art.digest: FIGURES})
        assert got == art.digest
        report_id = row.id
    seen.append(_generation(db, model))
    with db.session() as s:
        assert revoke_device(s, f"phone-{label}") == 1
    seen.append(_generation(db, model))
    with db.session() as s:
        s.execute(text("DELETE FROM device_verifications WHERE id = :i"), {"i": report_id})
    seen.append(_generation(db, model))
    return seen


def _steps(seen: list[int]) -> list[int]:
    return [b - a for a, b in zip(seen, seen[1:], strict=False)]


def test_lab_reports_bump_the_generation_through_model_generation_bump(pg_url: str) -> None:
    from alembic import command

    db = Database(pg_url, auto_upgrade=False)
    try:
        assert current_revision(db.engine) == SCHEMA_HEAD
        body = _trigger_body(db)
        assert "model_generation_bump(" in body and "ON CONFLICT" not in body, body
        assert _steps(_report_strike_delete(db, "head")) == [1, 1, 1]
    finally:
        db.dispose()

    engine: Any = make_engine(pg_url)
    try:
        command.downgrade(alembic_config(engine), "0019")
        assert current_revision(engine) == "0019"
    finally:
        engine.dispose()
    old = Database(pg_url, check=False)
    try:
        body = _trigger_body(old)
        assert "ON CONFLICT" in body and "model_generation_bump" not in body, body
        assert _steps(_report_strike_delete(old, "at-0019")) == [1, 1, 1]
    finally:
        old.dispose()

    engine = make_engine(pg_url)
    try:
        command.upgrade(alembic_config(engine), "head")
    finally:
        engine.dispose()
    again = Database(pg_url, auto_upgrade=False)
    try:
        assert "model_generation_bump(" in _trigger_body(again)
        assert _steps(_report_strike_delete(again, "upgraded")) == [1, 1, 1]
    finally:
        again.dispose()
