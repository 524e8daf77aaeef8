"""Each trial says where it started from: a fine-tuning run's lineage, the trial key of the
pre-training run it was initialised from (a chained sweep's) or that run's work dir; null for a
run trained from scratch and for trials stored before.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trials') as batch:
        batch.add_column(sa.Column('init_from', sa.String(length=1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trials') as batch:
        batch.drop_column('init_from')
