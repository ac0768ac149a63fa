"""twin builds: a genai part's twin compile is a build of its own

``twin_builds``: the columns of ``builds`` (key, state, lease, attempts, queue, phases: the same
guarded transitions, farm.pipeline.states) and ``output`` (the blobs it compiled). A table of its
own, not rows of ``builds``: nothing that serves devices reads it (no artifact, no coverage cell,
no tag), so no reader needs to leave it out.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('twin_builds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('build_key', sa.String(length=64), nullable=False),
    sa.Column('model_digest', sa.String(length=71), nullable=False),
    sa.Column('backend', sa.String(length=16), nullable=False),
    sa.Column('target', sa.String(length=64), nullable=False),
    sa.Column('toolchain', sa.String(length=64), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('options_digest', sa.String(length=71), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('error_code', sa.String(length=32), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('log', sa.Text(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=255), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('queue', sa.String(length=128), nullable=True),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('worker', sa.String(length=255), nullable=True),
    sa.Column('phases', sa.JSON(), nullable=True),
    sa.Column('output', sa.JSON(), nullable=True),
    sa.CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed')", name=op.f('ck_twin_builds_state_known')),
    sa.CheckConstraint('attempts >= 0', name=op.f('ck_twin_builds_attempts_nonneg')),
    sa.CheckConstraint('length(build_key) = 64', name=op.f('ck_twin_builds_build_key_shape')),
    sa.ForeignKeyConstraint(['model_digest'], ['models.digest'], name=op.f('fk_twin_builds_model_digest_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_twin_builds')),
    sa.UniqueConstraint('build_key', name=op.f('uq_twin_builds_build_key'))
    )
    op.create_index(op.f('ix_twin_builds_state_queue'), 'twin_builds', ['state', 'queue'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_twin_builds_state_queue'), table_name='twin_builds')
    op.drop_table('twin_builds')
