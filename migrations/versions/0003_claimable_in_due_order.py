"""work_items_claimable indexes (stage, next_attempt_at, id) instead of (stage, id).

Claims now take items in due order, so a claim is one range scan that stops at the first item not
yet due. With the old index the planner often preferred the primary key when its statistics said
most rows were pending, and then stepped over every finished row before the first claimable one;
items waiting for their back-off were visited by every claim.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_CLAIMABLE = sa.text("status IN ('pending', 'failed')")


def upgrade() -> None:
    op.drop_index("work_items_claimable", table_name="work_items", schema="dataminer")
    op.create_index(
        "work_items_claimable",
        "work_items",
        ["stage", "next_attempt_at", "id"],
        schema="dataminer",
        postgresql_where=_CLAIMABLE,
    )


def downgrade() -> None:
    op.drop_index("work_items_claimable", table_name="work_items", schema="dataminer")
    op.create_index(
        "work_items_claimable",
        "work_items",
        ["stage", "id"],
        schema="dataminer",
        postgresql_where=_CLAIMABLE,
    )
