from __future__ import annotations

from pathlib import Path

import pytest

from farm.core.settings import Settings


@pytest.fixture(scope="session")
def migrated_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite index whose schema the Alembic migrations made (as on a fresh FARM_HOME's first
    use), once per session: ``copy_index`` gives each test its own copy in ~10 ms, where
    migrating a new file took 0.3-0.5 s."""
    from registry.db import Database

    path = tmp_path_factory.mktemp("migrated") / "index.db"
    Database(f"sqlite:///{path}").dispose()
    return path


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Embedded settings in a private FARM_HOME (SQLite + local blob dir)."""
    return Settings.from_env({"FARM_HOME": str(tmp_path / "farm-home")})


@pytest.fixture
def farm_env(settings: Settings) -> dict[str, str]:
    """Environment for `farm` subprocesses that use the same FARM_HOME as ``settings``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["FARM_HOME"] = str(settings.home)
    return env


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``long`` first (a stable sort: the rest keep their order): a parallel run
    hands them out at its start instead of ending with one worker busy on them alone."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
