"""build phases: the per-build time breakdown (claim, bundle fetch, compile, uploads, SQL)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column: SQLite adds it in place, PostgreSQL without rewriting the table.
    op.add_column('builds', sa.Column('phases', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('builds') as batch:
        batch.drop_column('phases')
