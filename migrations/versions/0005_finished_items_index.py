"""work_items_finished: the finished items of a stage, newest first.

The lease reaper asks on every tick how long each running stage's last 200 finished items took
(LeaseStore.long_running). Without an index that was a scan and a sort of every finished item
of the stage, growing with the whole history; with it, 200 index entries.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def upgrade() -> None:
    op.create_index(
        "work_items_finished",
        "work_items",
        ["stage", sa.text("finished_at DESC")],
        schema=_SCHEMA,
        postgresql_where=sa.text("status = 'done'"),
    )


def downgrade() -> None:
    op.drop_index("work_items_finished", table_name="work_items", schema=_SCHEMA)
