"""device evidence: platform, independence, withdrawal

- ``device_reports.arch``: the CPU architecture the reporting runtime ran on. Every row stored
  before this revision has none and is struck (``revoked_why`` = ``no platform``): it can't be
  told from the x86_64 HTP simulator's, which poisoned the fleet's evidence. Shown, never counted.
- ``device_reports.revoked_why``: why a report was struck (revoked by an admin, token revoked,
  quarantine lifted, no platform).
- Reports of tokens already revoked are struck (revoking a token now withdraws what it said).
- The coverage triggers (``registry.coverage_sql``, code) count a device confirmation only on the
  cell of the report's own SoC, and touch a cell or bump a model's resolve generation only for a
  report that can change them (reports arrive at fleet rate): reinstalled, every cell
  recomputed. An index on (artifact, runtime, SoC, token) makes "another token reported here"
  two index seeks.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    from registry import coverage_sql

    bind = op.get_bind()
    with op.batch_alter_table('device_reports') as batch:
        batch.add_column(sa.Column('arch', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('revoked_why', sa.String(length=64), nullable=True))
        batch.create_index('ix_device_reports_group_token',
                           ['artifact_id', 'runtime_backend', 'runtime_version', 'soc', 'token_id'], unique=False)
    op.execute("UPDATE device_reports SET revoked_at = CURRENT_TIMESTAMP, revoked_why = 'token revoked'"
               " WHERE revoked_at IS NULL AND token_id IN (SELECT id FROM api_tokens WHERE revoked_at IS NOT NULL)")
    op.execute("UPDATE device_reports SET revoked_at = CURRENT_TIMESTAMP, revoked_why = 'no platform'"
               " WHERE revoked_at IS NULL AND arch IS NULL")
    for statement in coverage_sql.install(bind.dialect.name):
        op.execute(statement)
    for statement in coverage_sql.rebuild(bind.dialect.name):
        op.execute(statement)


def downgrade() -> None:
    from registry import coverage_sql

    bind = op.get_bind()
    # SQLite's batch mode recreates the table: the triggers on it go first, and come back after.
    for statement in coverage_sql.uninstall(bind.dialect.name):
        op.execute(statement)
    with op.batch_alter_table('device_reports') as batch:
        batch.drop_index('ix_device_reports_group_token')
        batch.drop_column('revoked_why')
        batch.drop_column('arch')
    for statement in (*coverage_sql.install(bind.dialect.name), *coverage_sql.rebuild(bind.dialect.name)):
        op.execute(statement)
