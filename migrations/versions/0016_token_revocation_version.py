"""a revocation version the service checks its cached tokens against

``token_revocations``: one row (id 1) whose ``version`` every token revocation bumps in its own
transaction. Each request a service process answers from its token cache first reads the version
(one indexed single-row read); a cached token is trusted only while the version it was read under
is unchanged, so a revoked token stops at once in every process (it was cached for 5 s before).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table('token_revocations',
    sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.CheckConstraint('id = 1', name=op.f('ck_token_revocations_one_row')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_token_revocations'))
    )
    op.bulk_insert(table, [{'id': 1, 'version': 0}])


def downgrade() -> None:
    op.drop_table('token_revocations')
