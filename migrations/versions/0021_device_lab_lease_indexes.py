"""device lab: the indexes a lease and a report use

``ix_verification_jobs_open``: the open jobs (``state <> 'done'``) in id order, a partial index:
a lease walks the open queue from its head and never the lab's history of done jobs.
``ix_verification_jobs_device_id``: the jobs a device holds (a lease never gives it a second job
of a cell). ``ix_devices_token_id``: every lease, renewal and report finds its device by its
bearer token.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28 22:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('verification_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_verification_jobs_open', ['id'], unique=False,
                              postgresql_where=sa.text("state <> 'done'"), sqlite_where=sa.text("state <> 'done'"))
        batch_op.create_index(batch_op.f('ix_verification_jobs_device_id'), ['device_id'], unique=False)
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_devices_token_id'), ['token_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_devices_token_id'))
    with op.batch_alter_table('verification_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_verification_jobs_device_id'))
        batch_op.drop_index('ix_verification_jobs_open')
