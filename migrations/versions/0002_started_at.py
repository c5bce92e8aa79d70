"""work_items.started_at: when the lease holder began the item (NULL: claimed, not started).

A run that dies gives back the items it never started without counting an attempt, so one item
that kills its process does not use up the attempts of the rest of its batch.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "work_items", sa.Column("started_at", sa.DateTime(timezone=True)), schema="dataminer"
    )


def downgrade() -> None:
    op.drop_column("work_items", "started_at", schema="dataminer")
