"""Claim tables: projects, videos, frames per profile, project membership, work items, run heartbeats.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

S = "dataminer"
NOW = sa.text("now()")


def _timestamps():
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
    ]


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("config", JSONB, nullable=False),
        sa.Column("config_hash", sa.Text, nullable=False),
        sa.Column("output_dir", sa.Text, nullable=False),
        sa.Column("stage", sa.Text, nullable=False, server_default="active"),
        sa.Column(
            "stage_changed_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW
        ),
        sa.Column("error", sa.Text),
        *_timestamps(),
        sa.CheckConstraint("name ~ '^[A-Za-z0-9_-]{1,64}$'", name="project_name_safe"),
        schema=S,
    )
    op.create_table(
        "videos",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("video_id", sa.Text, nullable=False, unique=True),
        sa.Column("url", sa.Text),
        sa.Column("source_path", sa.Text),
        sa.Column("file_path", sa.Text),
        sa.Column("size_bytes", sa.BigInteger),
        sa.Column("title", sa.Text),
        sa.Column("duration_s", sa.Float),
        sa.Column("fps", sa.Float),
        sa.Column("width", sa.Integer),
        sa.Column("height", sa.Integer),
        sa.Column("uploader", sa.Text),
        sa.Column("upload_date", sa.Text),
        sa.Column("tags", JSONB),
        sa.Column("backed_up_at", sa.DateTime(timezone=True)),
        sa.Column("backup_dest", sa.Text),
        *_timestamps(),
        sa.CheckConstraint("video_id ~ '^[A-Za-z0-9_-]{1,64}$'", name="video_id_safe"),
        sa.CheckConstraint("url IS NOT NULL OR source_path IS NOT NULL", name="video_has_source"),
        schema=S,
    )
    op.create_table(
        "video_frames",
        sa.Column(
            "video_id",
            sa.Text,
            sa.ForeignKey(f"{S}.videos.video_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("profile_id", sa.Text, primary_key=True),
        sa.Column("options", JSONB, nullable=False),
        sa.Column("frames_dir", sa.Text, nullable=False),
        sa.Column("frame_count", sa.Integer, nullable=False),
        *_timestamps(),
        schema=S,
    )
    op.create_table(
        "project_videos",
        sa.Column(
            "project_id",
            sa.Integer,
            sa.ForeignKey(f"{S}.projects.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column(
            "video_id",
            sa.Text,
            sa.ForeignKey(f"{S}.videos.video_id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("source_info", sa.Text),
        sa.Column("frames_total", sa.Integer),
        sa.Column("frames_passed", sa.Integer),
        *_timestamps(),
        sa.CheckConstraint(
            "source IN ('search', 'url', 'url_file', 'file', 'manual')", name="pv_source"
        ),
        schema=S,
    )
    op.create_index("project_videos_video", "project_videos", ["video_id"], schema=S)
    op.create_table(
        "work_items",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("stage", sa.Text, nullable=False),
        sa.Column("item_key", sa.Text, nullable=False),
        sa.Column("project_id", sa.Integer, sa.ForeignKey(f"{S}.projects.id", ondelete="CASCADE")),
        sa.Column("video_id", sa.Text, sa.ForeignKey(f"{S}.videos.video_id", ondelete="CASCADE")),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column(
            "next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW
        ),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_token", UUID(as_uuid=True)),
        sa.Column("leased_at", sa.DateTime(timezone=True)),
        sa.Column("requested_at", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text),
        sa.Column("outcome", JSONB),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        *_timestamps(),
        sa.UniqueConstraint("stage", "item_key", name="work_items_stage_key"),
        sa.CheckConstraint(
            "status IN ('pending', 'running', 'done', 'failed', 'dead', 'blocked')",
            name="work_item_status",
        ),
        sa.CheckConstraint(
            "(status = 'running') = (lease_token IS NOT NULL)", name="work_item_lease"
        ),
        schema=S,
    )
    op.create_index(
        "work_items_claimable",
        "work_items",
        ["stage", "id"],
        schema=S,
        postgresql_where=sa.text("status IN ('pending', 'failed')"),
    )
    op.create_index(
        "work_items_running",
        "work_items",
        ["lease_owner"],
        schema=S,
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index("work_items_project", "work_items", ["project_id", "stage", "status"], schema=S)
    op.create_index("work_items_video", "work_items", ["video_id"], schema=S)
    op.create_table(
        "run_heartbeats",
        sa.Column("run_id", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=NOW),
        schema=S,
    )
    op.create_index("run_heartbeats_at", "run_heartbeats", ["heartbeat_at"], schema=S)


def downgrade() -> None:
    for table in (
        "run_heartbeats",
        "work_items",
        "project_videos",
        "video_frames",
        "videos",
        "projects",
    ):
        op.drop_table(table, schema=S)
