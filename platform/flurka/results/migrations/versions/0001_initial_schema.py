"""Initial schema: environments, sweeps, trials, metrics, curve points, speed measurements.

Revision ID: 0001
Revises: (none)
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('environments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('fingerprint', sa.String(length=64), nullable=False),
    sa.Column('device', sa.String(length=255), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=False),
    sa.Column('versions', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_environments')),
    sa.UniqueConstraint('fingerprint', name=op.f('uq_environments_fingerprint'))
    )
    op.create_table('speed_measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('mechanism', sa.String(length=32), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=True),
    sa.Column('seq_len', sa.Integer(), nullable=False),
    sa.Column('d_model', sa.Integer(), nullable=False),
    sa.Column('heads', sa.Integer(), nullable=False),
    sa.Column('d_k', sa.Integer(), nullable=True),
    sa.Column('num_features', sa.Integer(), nullable=True),
    sa.Column('batch', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=32), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('median_s', sa.Float(), nullable=True),
    sa.Column('spread_s', sa.Float(), nullable=True),
    sa.Column('flops', sa.Float(), nullable=True),
    sa.Column('config', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_speed_measurements_environment_id_environments')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_speed_measurements')),
    sa.UniqueConstraint('key', name=op.f('uq_speed_measurements_key'))
    )
    op.create_index(op.f('ix_speed_measurements_environment_id'), 'speed_measurements', ['environment_id'])
    op.create_index(op.f('ix_speed_measurements_mechanism'), 'speed_measurements', ['mechanism'])
    op.create_table('sweeps',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('external_id', sa.String(length=255), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('git_commit', sa.String(length=64), nullable=True),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_sweeps_environment_id_environments')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps')),
    sa.UniqueConstraint('external_id', name=op.f('uq_sweeps_external_id'))
    )
    op.create_index(op.f('ix_sweeps_environment_id'), 'sweeps', ['environment_id'])
    op.create_table('trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('sweep_id', sa.Integer(), nullable=False),
    sa.Column('trial_key', sa.String(length=255), nullable=False),
    sa.Column('attention', sa.String(length=32), nullable=False),
    sa.Column('benchmark', sa.String(length=64), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=255), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('alpha', sa.Float(), nullable=True),
    sa.Column('base', sa.String(length=32), nullable=True),
    sa.Column('d_k', sa.Integer(), nullable=True),
    sa.Column('num_features', sa.Integer(), nullable=True),
    sa.Column('train_flops', sa.Float(), nullable=True),
    sa.Column('wall_time_s', sa.Float(), nullable=True),
    sa.Column('config', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], name=op.f('fk_trials_sweep_id_sweeps'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_trials')),
    sa.UniqueConstraint('sweep_id', 'trial_key', name=op.f('uq_trials_sweep_id_trial_key'))
    )
    op.create_index(op.f('ix_trials_attention'), 'trials', ['attention'])
    op.create_index(op.f('ix_trials_benchmark'), 'trials', ['benchmark'])
    op.create_table('curve_points',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], name=op.f('fk_curve_points_trial_id_trials'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_curve_points')),
    sa.UniqueConstraint('trial_id', 'name', 'step', name=op.f('uq_curve_points_trial_id_name_step'))
    )
    op.create_table('metrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('trial_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['trial_id'], ['trials.id'], name=op.f('fk_metrics_trial_id_trials'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_metrics')),
    sa.UniqueConstraint('trial_id', 'name', name=op.f('uq_metrics_trial_id_name'))
    )


def downgrade() -> None:
    op.drop_table('metrics')
    op.drop_table('curve_points')
    op.drop_index(op.f('ix_trials_benchmark'), table_name='trials')
    op.drop_index(op.f('ix_trials_attention'), table_name='trials')
    op.drop_table('trials')
    op.drop_index(op.f('ix_sweeps_environment_id'), table_name='sweeps')
    op.drop_table('sweeps')
    op.drop_index(op.f('ix_speed_measurements_mechanism'), table_name='speed_measurements')
    op.drop_index(op.f('ix_speed_measurements_environment_id'), table_name='speed_measurements')
    op.drop_table('speed_measurements')
    op.drop_table('environments')
