"""build compatibility strings and the op types a build left on the CPU (issue 30)

``artifacts.compatibility``: the EP's own compatibility string by EP name, read from the context
model's ``ep_compatibility_info.<EP>`` metadata (``{"QNNExecutionProvider": "v2:6:2.51.0:..."}``);
``artifacts.cpu_op_types``: the op types a partly offloaded build left on the CPU ([] when fully
offloaded). Both are also in each new manifest; artifacts published before this revision keep
NULL (their manifests predate the fields).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE on both dialects: a batch (copy-and-move) on SQLite would drop the
    # coverage triggers on artifacts (migration 0008).
    op.add_column('artifacts', sa.Column('cpu_op_types', sa.JSON(), nullable=True))
    op.add_column('artifacts', sa.Column('compatibility', sa.JSON(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite >= 3.35 (no batch, as above).
    op.execute("ALTER TABLE artifacts DROP COLUMN compatibility")
    op.execute("ALTER TABLE artifacts DROP COLUMN cpu_op_types")
