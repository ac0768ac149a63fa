"""coverage summary kept up to date as builds finish

Three tables kept by triggers, in the transaction that changes a build's state, inserts or marks
an artifact, or records a verdict (every writer: the ORM, the bare connections, psql):

- ``coverage_cells``: one row per (model, backend, target, toolchain) that has a build, with its
  counts and derived state (built | building | broken | failed);
- ``coverage_deltas``: append-only counter changes per scope (the whole farm, or ``tag:TAG``: the
  models with a NAME:TAG, kept as tags move) and (backend, target, toolchain); the summary is their sum, folded now and then by ``registry.coverage.compact`` (no hot counter row that
  every finishing build would queue on);
- ``model_generations``: a counter per model digest bumped whenever what resolve reads of it
  changes (artifacts, probe verdicts, device reports, signatures): the service's cached
  answers are keyed by it.

The trigger bodies come from ``registry.coverage_sql`` (one template for PostgreSQL and SQLite).
``install`` drops what it creates first: a later migration that changes what a cell counts (e.g. counting
multi-SoC artifacts in each SoC's cell, 0009) calls it again, then ``rebuild``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

COUNTERS = ("cells", "built", "building", "broken", "failed", "probe_verified", "device_verified", "wanted")


def upgrade() -> None:
    from registry import coverage_sql

    op.create_table(
        'coverage_cells',
        sa.Column('model_digest', sa.String(length=71), nullable=False),
        sa.Column('backend', sa.String(length=16), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('toolchain', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('builds', sa.Integer(), nullable=False),
        sa.Column('succeeded', sa.Integer(), nullable=False),
        sa.Column('building', sa.Integer(), nullable=False),
        sa.Column('failed', sa.Integer(), nullable=False),
        sa.Column('broken', sa.Integer(), nullable=False),
        sa.Column('probe_verified', sa.Integer(), nullable=False),
        sa.Column('device_verified', sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint('model_digest', 'backend', 'target', 'toolchain', name=op.f('pk_coverage_cells')),
    )
    op.create_index(op.f('ix_coverage_cells_backend_target_toolchain_state'), 'coverage_cells',
                    ['backend', 'target', 'toolchain', 'state'], unique=False)
    op.create_table(
        'coverage_deltas',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('scope', sa.String(length=140), nullable=False),
        sa.Column('backend', sa.String(length=16), nullable=False),
        sa.Column('target', sa.String(length=64), nullable=False),
        sa.Column('toolchain', sa.String(length=64), nullable=False),
        *[sa.Column(c, sa.Integer(), nullable=False) for c in COUNTERS],
        sa.PrimaryKeyConstraint('id', name=op.f('pk_coverage_deltas')),
    )
    op.create_table(
        'model_generations',
        sa.Column('model_digest', sa.String(length=71), nullable=False),
        sa.Column('generation', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('model_digest', name=op.f('pk_model_generations')),
    )
    # The drill-down pages models by name; the page's tags are read by digest.
    op.create_index(op.f('ix_models_first_name_digest'), 'models', ['first_name', 'digest'], unique=False)
    op.create_index(op.f('ix_tags_model_digest'), 'tags', ['model_digest'], unique=False)
    bind = op.get_bind()
    for statement in coverage_sql.install(bind.dialect.name):
        op.execute(statement)
    # Existing rows: the cells and the summary recomputed once, in this transaction.
    for statement in coverage_sql.rebuild(bind.dialect.name):
        op.execute(statement)


def downgrade() -> None:
    from registry import coverage_sql

    bind = op.get_bind()
    for statement in coverage_sql.uninstall(bind.dialect.name):
        op.execute(statement)
    op.drop_index(op.f('ix_tags_model_digest'), table_name='tags')
    op.drop_index(op.f('ix_models_first_name_digest'), table_name='models')
    op.drop_table('model_generations')
    op.drop_table('coverage_deltas')
    op.drop_index(op.f('ix_coverage_cells_backend_target_toolchain_state'), table_name='coverage_cells')
    op.drop_table('coverage_cells')
