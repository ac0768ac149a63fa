"""The index schema's history (Alembic): env.py and versions/, one revision per change, applied by
`farm db upgrade` and registry.db.migrate; the test schema is made by `alembic upgrade head`.
env.py imports registry.models and registry.db (the metadata); a revision imports only alembic and sqlalchemy."""
