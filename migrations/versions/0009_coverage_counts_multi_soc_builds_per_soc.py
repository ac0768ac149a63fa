"""coverage counts a multi-SoC build in each SoC's cell

A QNN build for ``SM8650+SM8750`` had a coverage cell of its own, a pseudo-target no device has.
The triggers of ``registry.coverage_sql`` now touch, and recompute, the cell of each SoC such a
build names (beside that SoC's own builds); this reinstalls them and recomputes every cell and
the summary once, in this transaction. No table changes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 14:00:00.000000
"""

from __future__ import annotations

from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    from registry import coverage_sql

    bind = op.get_bind()
    for statement in coverage_sql.install(bind.dialect.name):
        op.execute(statement)
    for statement in coverage_sql.rebuild(bind.dialect.name):
        op.execute(statement)


def downgrade() -> None:
    # The triggers are code (registry.coverage_sql), not schema: the ones installed stay and keep
    # counting per SoC at 0008, whose downgrade drops them.
    pass
