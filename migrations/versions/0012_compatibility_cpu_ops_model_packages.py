"""build compatibility strings, the op types a build left on the CPU, and ORT model packages

``artifacts.compatibility``: the EP's own compatibility string by EP name, read from the context
model's ``ep_compatibility_info.<EP>`` metadata (``{"QNNExecutionProvider": "v2:6:2.51.0:..."}``);
``artifacts.cpu_op_types``: the op types a partly offloaded build left on the CPU ([] when fully
offloaded). Both are also in each new manifest; artifacts published before this revision keep
NULL (their manifests predate the fields).

``model_packages``: one row per ORT model package ``farm package`` made and verified: its
record's digest, what it was made from (``inputs``: UNIQUE, so the same inputs are answered from
the index), the model, the NAME:TAG, its size and its files (every blob it references: ``farm
registry gc`` keeps them).

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
    op.create_table(
        'model_packages',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(length=71), nullable=False),
        sa.Column('inputs', sa.String(length=64), nullable=False),
        sa.Column('model_digest', sa.String(length=71), nullable=False),
        sa.Column('ref', sa.String(length=400), nullable=False),
        sa.Column('size', sa.BigInteger(), nullable=False),
        sa.Column('files', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("digest LIKE 'sha256:%' AND length(digest) = 71", name=op.f('ck_model_packages_digest_shape')),
        sa.ForeignKeyConstraint(['model_digest'], ['models.digest'], name=op.f('fk_model_packages_model_digest_models')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_model_packages')),
        sa.UniqueConstraint('digest', name=op.f('uq_model_packages_digest')),
        sa.UniqueConstraint('inputs', name=op.f('uq_model_packages_inputs')),
    )
    op.create_index(op.f('ix_model_packages_model_digest'), 'model_packages', ['model_digest'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_model_packages_model_digest'), table_name='model_packages')
    op.drop_table('model_packages')
    # ALTER TABLE ... DROP COLUMN: PostgreSQL, and SQLite >= 3.35 (no batch, as above).
    op.execute("ALTER TABLE artifacts DROP COLUMN compatibility")
    op.execute("ALTER TABLE artifacts DROP COLUMN cpu_op_types")
