"""blob puts counted per token: uploaded blobs nothing references yet count against the token's quota

``blob_puts``: each blob a token stored with ``PUT /v1/blobs/DIGEST``, with its size, until a model
or a genai package comes to reference it (the row goes) or ``FARM_UPLOAD_TTL_S`` passes: what
the token's blobs that nothing references yet hold counts against ``FARM_QUOTA_UPLOAD_MB`` with
its open upload sessions.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('blob_puts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('digest', sa.String(length=71), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], name=op.f('fk_blob_puts_token_id_api_tokens')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_blob_puts'))
    )
    with op.batch_alter_table('blob_puts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_blob_puts_token_id'), ['token_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_blob_puts_digest'), ['digest'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('blob_puts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_blob_puts_digest'))
        batch_op.drop_index(batch_op.f('ix_blob_puts_token_id'))
    op.drop_table('blob_puts')
