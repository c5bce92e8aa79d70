"""Host throttle: host_pauses (a host that said stop, until when, why) and download_slots (the
downloads in progress per host across every run).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"


def _now() -> sa.TextClause:
    return sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "host_pauses",
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("paused_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("strikes", sa.Integer, nullable=False, server_default="0"),
        sa.Column("pauses", sa.Integer, nullable=False, server_default="0"),
        sa.Column("run_id", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        schema=_SCHEMA,
    )
    op.create_table(
        "download_slots",
        sa.Column("token", UUID(as_uuid=True), primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("run_id", sa.Text, nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False, server_default=_now()),
        schema=_SCHEMA,
    )
    op.create_index("download_slots_host", "download_slots", ["host"], schema=_SCHEMA)


def downgrade() -> None:
    op.drop_table("download_slots", schema=_SCHEMA)
    op.drop_table("host_pauses", schema=_SCHEMA)
