"""the CPU reference outputs kept with a model's samples

``model_samples.reference_digest`` / ``reference_size``: the ``.npz`` blob of the source model's
outputs on onnxruntime's CPU EP for the samples (made by the accuracy check), which device agents
compare their outputs against; ``reference_why``: why none is kept (over FARM_REFERENCE_MAX_BYTES).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 18:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('model_samples', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reference_digest', sa.String(length=71), nullable=True))
        batch_op.add_column(sa.Column('reference_size', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('reference_why', sa.String(length=300), nullable=True))
        batch_op.create_check_constraint(
            op.f('ck_model_samples_reference_digest_shape'),
            "reference_digest LIKE 'sha256:%' AND length(reference_digest) = 71")


def downgrade() -> None:
    with op.batch_alter_table('model_samples', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_model_samples_reference_digest_shape'), type_='check')
        batch_op.drop_column('reference_why')
        batch_op.drop_column('reference_size')
        batch_op.drop_column('reference_digest')
