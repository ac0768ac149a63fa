"""device lab: enrolled devices, verification jobs, promotions, tag gates

``devices`` (an enrollment token's hash until used, then the agent's Ed25519 key and facts),
``verification_jobs`` (leased, one nonce per lease), ``device_verifications`` (signed reports: one
per job, one per nonce), ``promotions`` and ``tag_gates`` (a tag promote moved).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 14:52:19.989599
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('promotions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('source', sa.String(length=128), nullable=True),
    sa.Column('model_digest', sa.String(length=71), nullable=False),
    sa.Column('previous_digest', sa.String(length=71), nullable=True),
    sa.Column('require', sa.String(length=500), nullable=True),
    sa.Column('allow_simulator', sa.Boolean(), nullable=False),
    sa.Column('evidence', sa.JSON(), nullable=False),
    sa.Column('by', sa.String(length=255), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_promotions'))
    )
    op.create_table('devices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('enroll_hash', sa.String(length=64), nullable=False),
    sa.Column('enroll_expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('enrolled_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('public_key', sa.String(length=64), nullable=True),
    sa.Column('key_id', sa.String(length=16), nullable=True),
    sa.Column('token_id', sa.Integer(), nullable=True),
    sa.Column('soc', sa.String(length=64), nullable=True),
    sa.Column('simulator', sa.Boolean(), nullable=False),
    sa.Column('facts', sa.JSON(), nullable=False),
    sa.Column('created_by', sa.String(length=255), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], name=op.f('fk_devices_token_id_api_tokens')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_devices')),
    sa.UniqueConstraint('enroll_hash', name=op.f('uq_devices_enroll_hash')),
    sa.UniqueConstraint('key_id', name=op.f('uq_devices_key_id')),
    sa.UniqueConstraint('name', name=op.f('uq_devices_name'))
    )
    op.create_table('tag_gates',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('tag', sa.String(length=128), nullable=False),
    sa.Column('promotion_id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['promotion_id'], ['promotions.id'], name=op.f('fk_tag_gates_promotion_id_promotions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tag_gates')),
    sa.UniqueConstraint('name', 'tag', name=op.f('uq_tag_gates_name_tag'))
    )
    op.create_table('verification_jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('artifact_id', sa.Integer(), nullable=False),
    sa.Column('soc', sa.String(length=64), nullable=False),
    sa.Column('slot', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=True),
    sa.Column('nonce', sa.String(length=64), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('done_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('queued', 'leased', 'done')", name=op.f('ck_verification_jobs_state_known')),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_verification_jobs_artifact_id_artifacts')),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_verification_jobs_device_id_devices')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_verification_jobs')),
    sa.UniqueConstraint('artifact_id', 'soc', 'slot', name=op.f('uq_verification_jobs_artifact_id_soc_slot'))
    )
    with op.batch_alter_table('verification_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_verification_jobs_artifact_id'), ['artifact_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_verification_jobs_state_soc'), ['state', 'soc'], unique=False)

    op.create_table('device_verifications',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('artifact_id', sa.Integer(), nullable=False),
    sa.Column('soc', sa.String(length=64), nullable=False),
    sa.Column('simulator', sa.Boolean(), nullable=False),
    sa.Column('nonce', sa.String(length=64), nullable=False),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('psnr_db', sa.Float(), nullable=True),
    sa.Column('load_ms', sa.Float(), nullable=True),
    sa.Column('first_inference_ms', sa.Float(), nullable=True),
    sa.Column('p50_ms', sa.Float(), nullable=True),
    sa.Column('peak_memory_mb', sa.Float(), nullable=True),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.Column('signature', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('struck_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('struck_why', sa.String(length=64), nullable=True),
    sa.CheckConstraint("outcome IN ('ok', 'fails', 'crashed')", name=op.f('ck_device_verifications_outcome_known')),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_device_verifications_artifact_id_artifacts')),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], name=op.f('fk_device_verifications_device_id_devices')),
    sa.ForeignKeyConstraint(['job_id'], ['verification_jobs.id'], name=op.f('fk_device_verifications_job_id_verification_jobs')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_device_verifications')),
    sa.UniqueConstraint('job_id', name=op.f('uq_device_verifications_job_id')),
    sa.UniqueConstraint('nonce', name=op.f('uq_device_verifications_nonce'))
    )
    with op.batch_alter_table('device_verifications', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_device_verifications_artifact_id_soc'), ['artifact_id', 'soc'], unique=False)
        batch_op.create_index(batch_op.f('ix_device_verifications_device_id'), ['device_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('device_verifications', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_device_verifications_device_id'))
        batch_op.drop_index(batch_op.f('ix_device_verifications_artifact_id_soc'))

    op.drop_table('device_verifications')
    with op.batch_alter_table('verification_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_verification_jobs_state_soc'))
        batch_op.drop_index(batch_op.f('ix_verification_jobs_artifact_id'))

    op.drop_table('verification_jobs')
    op.drop_table('tag_gates')
    op.drop_table('devices')
    op.drop_table('promotions')
