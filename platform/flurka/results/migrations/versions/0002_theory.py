"""Theory measurements: theory runs, approximation errors, kernel ranks.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('theory_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('environment_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_theory_runs_environment_id_environments')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_theory_runs')),
    sa.UniqueConstraint('key', name=op.f('uq_theory_runs_key'))
    )
    op.create_index(op.f('ix_theory_runs_environment_id'), 'theory_runs', ['environment_id'])
    op.create_table('approximation_errors',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('theory_run_id', sa.Integer(), nullable=False),
    sa.Column('mechanism', sa.String(length=32), nullable=False),
    sa.Column('d_k', sa.Integer(), nullable=True),
    sa.Column('m', sa.Integer(), nullable=True),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('layer', sa.Integer(), nullable=True),
    sa.Column('rel_error', sa.Float(), nullable=False),
    sa.Column('inf_error', sa.Float(), nullable=False),
    sa.Column('kernel_term', sa.Float(), nullable=True),
    sa.Column('lowrank_term', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['theory_run_id'], ['theory_runs.id'], name=op.f('fk_approximation_errors_theory_run_id_theory_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_approximation_errors'))
    )
    op.create_index(op.f('ix_approximation_errors_theory_run_id'), 'approximation_errors', ['theory_run_id'])
    op.create_table('kernel_ranks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('theory_run_id', sa.Integer(), nullable=False),
    sa.Column('mechanism', sa.String(length=32), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=True),
    sa.Column('example', sa.Integer(), nullable=True),
    sa.Column('head', sa.Integer(), nullable=False),
    sa.Column('layer', sa.Integer(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('max_rank', sa.Integer(), nullable=False),
    sa.Column('d_k', sa.Integer(), nullable=True),
    sa.Column('m', sa.Integer(), nullable=True),
    sa.Column('trained', sa.Boolean(), nullable=True),
    sa.ForeignKeyConstraint(['theory_run_id'], ['theory_runs.id'], name=op.f('fk_kernel_ranks_theory_run_id_theory_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_kernel_ranks'))
    )
    op.create_index(op.f('ix_kernel_ranks_theory_run_id'), 'kernel_ranks', ['theory_run_id'])


def downgrade() -> None:
    op.drop_index(op.f('ix_kernel_ranks_theory_run_id'), table_name='kernel_ranks')
    op.drop_table('kernel_ranks')
    op.drop_index(op.f('ix_approximation_errors_theory_run_id'), table_name='approximation_errors')
    op.drop_table('approximation_errors')
    op.drop_index(op.f('ix_theory_runs_environment_id'), table_name='theory_runs')
    op.drop_table('theory_runs')
