"""work_items_troubled_own, work_items_troubled_videos: the items that failed, died or were
blocked, newest first; a project's own by project, its videos' (no project) in one.

`dataminer status NAME` lists a project's latest failures. Its videos' items have no project, so
they were found by reading every item without one: 0.2 s at 1,000,000 videos, for the ten rows
it shows. With these indexes each side walks the failures from the newest and stops at the tenth
of the project's (db/reports.py `recent_failures`). One index on (project_id, updated_at) would
not do: PostgreSQL does not walk `project_id IS NULL` in updated_at order (it read and sorted
300,000 blocked downloads, 136 ms).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"
_TROUBLED = "status IN ('failed', 'dead', 'blocked') AND last_error IS NOT NULL"


def upgrade() -> None:
    op.create_index(
        "work_items_troubled_own",
        "work_items",
        ["project_id", sa.text("updated_at DESC")],
        schema=_SCHEMA,
        postgresql_where=sa.text(f"{_TROUBLED} AND project_id IS NOT NULL"),
    )
    op.create_index(
        "work_items_troubled_videos",
        "work_items",
        [sa.text("updated_at DESC")],
        schema=_SCHEMA,
        postgresql_where=sa.text(f"{_TROUBLED} AND project_id IS NULL"),
    )


def downgrade() -> None:
    for name in ("work_items_troubled_own", "work_items_troubled_videos"):
        op.drop_index(name, table_name="work_items", schema=_SCHEMA)
