"""Speed measurements name their run (the flurka.speed document that timed them), so ratios of
two mechanisms are taken within one run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('speed_measurements') as batch:
        batch.add_column(sa.Column('run', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('speed_measurements') as batch:
        batch.drop_column('run')
