"""SQLite indexes for tests: a copy of one the migrations made (tests/conftest.py's
``migrated_index``), so a test starts from the schema a fresh FARM_HOME gets without migrating."""

from __future__ import annotations

from pathlib import Path


def copy_index(template: Path, dest: Path) -> str:
    """``template`` copied to ``dest`` through SQLite's backup API (every page, whatever its WAL
    holds); returns its database URL."""
    import sqlite3

    dest.parent.mkdir(parents=True, exist_ok=True)
    src, dst = sqlite3.connect(template), sqlite3.connect(dest)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return f"sqlite:///{dest}"
