"""Content identity: a video's content hash, and `same_as`, the video whose content it repeats.

Two files or URLs with the same bytes are one video. The download stage hashes each video's file
once (`content_hash`, SHA-256 of the bytes); a video whose hash an earlier video already has
becomes a copy of it (`same_as`), processed as that video: its projects are linked to the
original, whose frames and filter results they use. `content_hash` is indexed for that look-up
at every download, `same_as` for the copies of a video (deletions, status, the manifest's
sources). A project video linked through a copy has the source `copy`.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"
_SOURCES = "('search', 'url', 'url_file', 'file', 'manual')"
_SOURCES_WITH_COPY = "('search', 'url', 'url_file', 'file', 'manual', 'copy')"


def upgrade() -> None:
    op.add_column("videos", sa.Column("content_hash", sa.Text), schema=_SCHEMA)
    op.add_column(
        "videos",
        sa.Column(
            "same_as",
            sa.Text,
            sa.ForeignKey(f"{_SCHEMA}.videos.video_id", ondelete="SET NULL"),
        ),
        schema=_SCHEMA,
    )
    op.create_check_constraint(
        "video_not_same_as_itself", "videos", "same_as <> video_id", schema=_SCHEMA
    )
    op.create_index(
        "videos_content_hash",
        "videos",
        ["content_hash"],
        schema=_SCHEMA,
        postgresql_where=sa.text("content_hash IS NOT NULL"),
    )
    op.create_index(
        "videos_same_as",
        "videos",
        ["same_as"],
        schema=_SCHEMA,
        postgresql_where=sa.text("same_as IS NOT NULL"),
    )
    op.drop_constraint("pv_source", "project_videos", schema=_SCHEMA, type_="check")
    op.create_check_constraint(
        "pv_source", "project_videos", f"source IN {_SOURCES_WITH_COPY}", schema=_SCHEMA
    )


def downgrade() -> None:
    op.execute(f"DELETE FROM {_SCHEMA}.project_videos WHERE source = 'copy'")
    op.drop_constraint("pv_source", "project_videos", schema=_SCHEMA, type_="check")
    op.create_check_constraint(
        "pv_source", "project_videos", f"source IN {_SOURCES}", schema=_SCHEMA
    )
    op.drop_index("videos_same_as", table_name="videos", schema=_SCHEMA)
    op.drop_index("videos_content_hash", table_name="videos", schema=_SCHEMA)
    op.drop_constraint("video_not_same_as_itself", "videos", schema=_SCHEMA, type_="check")
    op.drop_column("videos", "same_as", schema=_SCHEMA)
    op.drop_column("videos", "content_hash", schema=_SCHEMA)
