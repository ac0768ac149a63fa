"""graph groups, multi-SoC builds, context binary descriptions, build memory

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The context binaries' own description (QNN System API) and the unverified reason.
    op.add_column('artifacts', sa.Column('description', sa.JSON(), nullable=True))
    # Which targets an artifact serves: its own, or every SoC of a multi-SoC build.
    op.create_table('artifact_targets',
    sa.Column('artifact_id', sa.Integer(), nullable=False),
    sa.Column('target', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_artifact_targets_artifact_id_artifacts'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('artifact_id', 'target', name=op.f('pk_artifact_targets'))
    )
    with op.batch_alter_table('artifact_targets', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_artifact_targets_target'), ['target'], unique=False)
    # Every artifact so far was built for one target.
    op.execute("INSERT INTO artifact_targets (artifact_id, target) SELECT id, target FROM artifacts")


def downgrade() -> None:
    with op.batch_alter_table('artifact_targets', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_artifact_targets_target'))
    op.drop_table('artifact_targets')
    with op.batch_alter_table('artifacts') as batch:
        batch.drop_column('description')
