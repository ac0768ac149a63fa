"""Alembic environment: runs on the engine handed in by registry.db (SQLite or PostgreSQL)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

import registry.models  # noqa: F401  (registers the tables on the metadata)
from registry.db import metadata

config = context.config


def run_migrations() -> None:
    engine = config.attributes.get("engine")
    if engine is None:
        url = config.get_main_option("sqlalchemy.url")
        engine = engine_from_config({"sqlalchemy.url": url}, prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            # SQLite cannot ALTER most things in place: batch mode copies the table.
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


run_migrations()
