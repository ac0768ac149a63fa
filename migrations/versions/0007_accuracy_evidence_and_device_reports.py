"""accuracy evidence and device reports

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The ``report`` scope (devices posting load reports).
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_api_tokens_scope_known'), type_='check')
        batch_op.create_check_constraint(op.f('ck_api_tokens_scope_known'),
                                         "scope IN ('read', 'submit', 'admin', 'report')")
    op.create_table('model_samples',
    sa.Column('model_digest', sa.String(length=71), nullable=False),
    sa.Column('digest', sa.String(length=71), nullable=False),
    sa.Column('size', sa.BigInteger(), nullable=False),
    sa.Column('inputs', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("digest LIKE 'sha256:%' AND length(digest) = 71", name=op.f('ck_model_samples_digest_shape')),
    sa.ForeignKeyConstraint(['model_digest'], ['models.digest'], name=op.f('fk_model_samples_model_digest_models')),
    sa.PrimaryKeyConstraint('model_digest', name=op.f('pk_model_samples'))
    )
    op.create_table('accuracy_results',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('artifact_id', sa.Integer(), nullable=False),
    sa.Column('runtime_backend', sa.String(length=16), nullable=False),
    sa.Column('runtime_version', sa.String(length=64), nullable=False),
    sa.Column('inputs', sa.String(length=80), nullable=False),
    sa.Column('numerics_key', sa.String(length=64), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('outputs', sa.JSON(), nullable=False),
    sa.Column('min_psnr_db', sa.Float(), nullable=True),
    sa.Column('worst_output', sa.String(length=255), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('run_seconds', sa.Float(), nullable=True),
    sa.Column('reference_seconds', sa.Float(), nullable=True),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("status IN ('ok', 'runtime-crashed', 'skipped', 'unverified')",
                       name=op.f('ck_accuracy_results_status_known')),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_accuracy_results_artifact_id_artifacts'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_accuracy_results')),
    sa.UniqueConstraint('artifact_id', 'runtime_backend', 'runtime_version', 'inputs', name='uq_accuracy_results_key')
    )
    with op.batch_alter_table('accuracy_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_accuracy_results_artifact_id'), ['artifact_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_accuracy_results_numerics_key'), ['numerics_key'], unique=False)

    op.create_table('device_reports',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('artifact_id', sa.Integer(), nullable=False),
    sa.Column('token_id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.String(length=128), nullable=False),
    sa.Column('device_model', sa.String(length=128), nullable=False),
    sa.Column('soc', sa.String(length=64), nullable=False),
    sa.Column('os', sa.String(length=128), nullable=False),
    sa.Column('runtime_backend', sa.String(length=16), nullable=False),
    sa.Column('runtime_version', sa.String(length=64), nullable=False),
    sa.Column('ort_version', sa.String(length=32), nullable=False),
    sa.Column('ep_package', sa.String(length=64), nullable=True),
    sa.Column('ep_version', sa.String(length=32), nullable=True),
    sa.Column('driver', sa.String(length=128), nullable=True),
    sa.Column('outcome', sa.String(length=8), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('load_ms', sa.Float(), nullable=True),
    sa.Column('first_inference_ms', sa.Float(), nullable=True),
    sa.Column('peak_memory_mb', sa.Float(), nullable=True),
    sa.Column('fingerprint', sa.String(length=128), nullable=True),
    sa.Column('psnr_db', sa.Float(), nullable=True),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.Column('reported_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("outcome IN ('loads', 'fails', 'crashed')", name=op.f('ck_device_reports_outcome_known')),
    sa.ForeignKeyConstraint(['artifact_id'], ['artifacts.id'], name=op.f('fk_device_reports_artifact_id_artifacts'),
                            ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], name=op.f('fk_device_reports_token_id_api_tokens')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_device_reports')),
    sa.UniqueConstraint('artifact_id', 'token_id', 'device_id', 'runtime_backend', 'runtime_version',
                        name='uq_device_reports_key')
    )
    with op.batch_alter_table('device_reports', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_device_reports_artifact_id_runtime_backend_runtime_version'),
                              ['artifact_id', 'runtime_backend', 'runtime_version'], unique=False)
        batch_op.create_index(batch_op.f('ix_device_reports_token_id'), ['token_id'], unique=False)


def downgrade() -> None:
    op.drop_table('device_reports')
    op.drop_table('accuracy_results')
    op.drop_table('model_samples')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_api_tokens_scope_known'), type_='check')
        batch_op.create_check_constraint(op.f('ck_api_tokens_scope_known'), "scope IN ('read', 'submit', 'admin')")
