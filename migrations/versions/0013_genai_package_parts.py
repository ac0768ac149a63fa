"""genai packages: genai_parts links a package's build to its parts' group builds

A genai package's build (farm.pipeline.genai) is assembled from one weight-shared group build
per part; on the cluster the fan-in (a part's build final -> the package's build sent) reads this
link. One row per (package build, part index).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'genai_parts',
        sa.Column('package_build_id', sa.Integer(), nullable=False),
        sa.Column('part', sa.Integer(), nullable=False),
        sa.Column('part_build_id', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['package_build_id'], ['builds.id'],
                                name=op.f('fk_genai_parts_package_build_id_builds'), ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['part_build_id'], ['builds.id'], name=op.f('fk_genai_parts_part_build_id_builds')),
        sa.PrimaryKeyConstraint('package_build_id', 'part', name=op.f('pk_genai_parts')),
    )
    op.create_index(op.f('ix_genai_parts_part_build_id'), 'genai_parts', ['part_build_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_genai_parts_part_build_id'), table_name='genai_parts')
    op.drop_table('genai_parts')
