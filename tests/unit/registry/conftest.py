from __future__ import annotations

import pytest

from registry.db import Database
from tests.common.indexes import copy_index


@pytest.fixture
def db(tmp_path, migrated_index):
    """A fresh SQLite index, schema made by the Alembic migrations (as in production): a copy of
    the session's ``migrated_index``."""
    database = Database(copy_index(migrated_index, tmp_path / "index.db"))
    yield database
    database.dispose()
