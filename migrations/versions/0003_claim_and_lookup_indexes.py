"""Cheaper claims: work_items_claimable in due order; project and video indexes without NULLs.

* work_items_claimable indexes (stage, next_attempt_at, id) instead of (stage, id). Claims take
  items in due order, so a claim is one range scan that stops at the first item not yet due. With
  the old index the planner often preferred the primary key when its statistics said most rows
  were pending, and then stepped over every finished row before the first claimable one; items
  waiting for their back-off were visited by every claim.
* work_items_project and work_items_video leave out rows whose project (per-video items) or video
  (project items) is NULL: no lookup asks for those, and every claim or completion of such a row
  wrote an entry for them.

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

_SCHEMA = "dataminer"
_CLAIMABLE = sa.text("status IN ('pending', 'failed')")


def _replace(name: str, columns: list[str], where: sa.TextClause | None) -> None:
    op.drop_index(name, table_name="work_items", schema=_SCHEMA)
    op.create_index(name, "work_items", columns, schema=_SCHEMA, postgresql_where=where)


def upgrade() -> None:
    _replace("work_items_claimable", ["stage", "next_attempt_at", "id"], _CLAIMABLE)
    _replace(
        "work_items_project", ["project_id", "stage", "status"], sa.text("project_id IS NOT NULL")
    )
    _replace("work_items_video", ["video_id"], sa.text("video_id IS NOT NULL"))


def downgrade() -> None:
    _replace("work_items_claimable", ["stage", "id"], _CLAIMABLE)
    _replace("work_items_project", ["project_id", "stage", "status"], None)
    _replace("work_items_video", ["video_id"], None)
