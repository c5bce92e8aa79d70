"""Sources listed again: a project's refresh request, and what each search and listing found.

`projects.acquisition` keeps where a project with a target is (its round, its state and why:
acquiring, reached, budget, exhausted). `projects.refresh_requested_at` marks a refresh asked for (`dataminer refresh`, the
refresh_sources sensor): the next catalog run links only the videos the project has not seen.
`project_sources` keeps, per search and listing, what its last listing found and, for one that
failed, its error and when it is asked again (a back-off that grows with each failure in a row).
`project_videos.source` may be `listing` (a feed, channel or playlist), and
`project_videos.frames_kept` counts a video's frames that dedup kept for the project (with
frames_total and frames_passed: the yield of each source).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_SCHEMA = "dataminer"
_SOURCES = "('search', 'url', 'url_file', 'file', 'manual', 'copy')"
_SOURCES_WITH_LISTING = "('search', 'url', 'url_file', 'file', 'manual', 'copy', 'listing')"


def upgrade() -> None:
    op.add_column(
        "projects", sa.Column("refresh_requested_at", sa.DateTime(timezone=True)), schema=_SCHEMA
    )
    op.add_column("projects", sa.Column("acquisition", JSONB), schema=_SCHEMA)
    op.create_table(
        "project_sources",
        sa.Column(
            "project_id",
            sa.Integer,
            sa.ForeignKey(f"{_SCHEMA}.projects.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("source", sa.Text, primary_key=True),
        sa.Column("listed_at", sa.DateTime(timezone=True)),
        sa.Column("videos_listed", sa.Integer, nullable=False, server_default="0"),
        sa.Column("videos_new", sa.Integer, nullable=False, server_default="0"),
        sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("last_error", sa.Text),
        sa.Column("retry_at", sa.DateTime(timezone=True)),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.text("now()"),
        ),
        schema=_SCHEMA,
    )
    op.add_column("project_videos", sa.Column("frames_kept", sa.Integer), schema=_SCHEMA)
    op.drop_constraint("pv_source", "project_videos", schema=_SCHEMA, type_="check")
    op.create_check_constraint(
        "pv_source", "project_videos", f"source IN {_SOURCES_WITH_LISTING}", schema=_SCHEMA
    )


def downgrade() -> None:
    op.execute(f"DELETE FROM {_SCHEMA}.project_videos WHERE source = 'listing'")
    op.drop_constraint("pv_source", "project_videos", schema=_SCHEMA, type_="check")
    op.create_check_constraint(
        "pv_source", "project_videos", f"source IN {_SOURCES}", schema=_SCHEMA
    )
    op.drop_column("project_videos", "frames_kept", schema=_SCHEMA)
    op.drop_table("project_sources", schema=_SCHEMA)
    op.drop_column("projects", "acquisition", schema=_SCHEMA)
    op.drop_column("projects", "refresh_requested_at", schema=_SCHEMA)
