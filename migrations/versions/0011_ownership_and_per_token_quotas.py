"""ownership and per-token quotas

``releases.owner_token_id`` (the token that submitted it through the service; only it or an admin
cancels it) and ``releases.cancelled_at`` (a cancelled release no longer wants its builds: a build
shared with a live release is not cancelled); ``upload_sessions``: each resumable upload, owned by
the token that opened it, with the bytes it holds (per-token quotas, expiry).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 22:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('upload_sessions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('owner_token_id', sa.Integer(), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('touched_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['owner_token_id'], ['api_tokens.id'],
                            name=op.f('fk_upload_sessions_owner_token_id_api_tokens')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_upload_sessions'))
    )
    with op.batch_alter_table('upload_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_upload_sessions_owner_token_id'), ['owner_token_id'], unique=False)
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner_token_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('cancelled_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_releases_owner_token_id'), ['owner_token_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_releases_owner_token_id_api_tokens'), 'api_tokens',
                                    ['owner_token_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_releases_owner_token_id_api_tokens'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_releases_owner_token_id'))
        batch_op.drop_column('cancelled_at')
        batch_op.drop_column('owner_token_id')
    with op.batch_alter_table('upload_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_upload_sessions_owner_token_id'))
    op.drop_table('upload_sessions')
