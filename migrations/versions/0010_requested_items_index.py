"""work_items_requested: the claimable items a sensor asked a run for, by when it asked.

The work sensor asks on every tick which project videos the downloads and extractions in flight
will bring to the filter (db/scheduling.py `coming`), starting from the items requested lately.
Without an index that was a scan of every claimable item: 0.1-2.8 s a tick at 1,000,000 videos.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_index(
        "work_items_requested",
        "work_items",
        ["requested_at"],
        schema=_SCHEMA,
        postgresql_where=sa.text("status IN ('pending', 'failed') AND requested_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("work_items_requested", table_name="work_items", schema=_SCHEMA)
