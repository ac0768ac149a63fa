from __future__ import annotations

import pytest

from registry.db import Database


@pytest.fixture
def db(tmp_path):
    """A fresh SQLite index, schema made by the Alembic migrations (as in production)."""
    database = Database("sqlite:///" + str(tmp_path / "index.db"))
    yield database
    database.dispose()
