"""A trial's up-training base is stored as ``--base`` spells it ("low-rank", "kernel"), no longer
as the base model's mechanism ("linformer", "rnn", ...): one word for one choice everywhere.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE trials SET base = 'low-rank' WHERE base = 'linformer'")
    op.execute("UPDATE trials SET base = 'kernel' WHERE base IN ('performer', 'rnn', 'eva')")


def downgrade() -> None:
    # the kernel base of flurka-X is X: the attention without its 7-character "flurka-" prefix
    op.execute("UPDATE trials SET base = substr(attention, 8) WHERE base = 'kernel' AND attention LIKE 'flurka-%'")
    op.execute("UPDATE trials SET base = 'linformer' WHERE base = 'low-rank'")
