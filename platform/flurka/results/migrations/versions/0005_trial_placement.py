"""Each trial says where it ran: its node, JAX device kind and count, and its peak memory (the
process's resident set, the most one device's allocator held), all nullable: unknown for trials
stored before and for those without a result.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

COLUMNS = ('node', 'device', 'device_count', 'peak_host_bytes', 'peak_device_bytes')


def upgrade() -> None:
    with op.batch_alter_table('trials') as batch:
        batch.add_column(sa.Column('node', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('device', sa.String(length=255), nullable=True))
        batch.add_column(sa.Column('device_count', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('peak_host_bytes', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('peak_device_bytes', sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trials') as batch:
        for column in reversed(COLUMNS):
            batch.drop_column(column)
