"""A fresh service on PostgreSQL warms what its first upload and release would otherwise pay
(six pipelines submitting at once to a fresh service): pooled index connections open,
the statements read, the store's client made; nothing written (no row, no blob, no id taken)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from farm.api.app import WARM_CONNECTIONS, create_app
from farm.core.settings import Settings
from tests.common.registry_state import snapshot


def test_a_fresh_service_on_postgresql_opens_its_pool_and_writes_nothing(pg_url: str, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.from_env({"FARM_HOME": str(tmp_path / "home"), "FARM_DATABASE_URL": pg_url})
    before = snapshot(settings)
    app = create_app(settings)
    pool = app.state.registry.db.engine.pool
    assert pool.checkedin() < WARM_CONNECTIONS  # create_app itself reads the index once
    with caplog.at_level(logging.WARNING, logger="ctxfarm.api"), TestClient(app) as client:
        assert pool.checkedin() >= WARM_CONNECTIONS  # opened at start, back in the pool
        assert client.get("/healthz").status_code == 200
    assert not [r for r in caplog.records if "not warmed up" in r.getMessage()], caplog.text
    assert snapshot(settings) == before
