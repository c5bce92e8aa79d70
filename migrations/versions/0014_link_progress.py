"""Each project video carries its video's progress: the download's and the extraction's status and
end, the video's length and size; `video_changes` notes the videos whose progress moved since.

`dataminer status NAME` read a project's videos joined to the videos and to each per-video
stage's items: 1.4-2.5 s at 1,000,000 videos, what the project holds, on every call. A video's
items are shared by every project that links it, so counts kept by triggers would need a lock
both sides take (issue 25; docs/architecture.md, "Under the daemon"). Instead triggers note, in
the transaction of each change, the videos whose per-video items moved (status or end), whose
length or size changed, or that were just linked; a copy (db/link_progress.py, the work sensor's
tick) writes the current state of the noted videos onto their links and removes those notes. The
status reads the links' own columns for the videos without a note and the live state for the few
with one, in one snapshot: exact whether or not the copy has run. Every linked video is noted
here, so the first copies fill the links of an upgraded database (reads stay exact meanwhile).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_S = "dataminer"
# The per-video stages whose progress the links carry (the board's: registry.py); a
# per-video stage added to the board later needs its own columns and a migration like this one.
_STAGES = ("download", "frames")
_STAGE_LIST = ", ".join(f"'{stage}'" for stage in _STAGES)


def _video_items(row: str) -> str:
    """SQL: `row` (an alias) is an item of a video (no project) of one of `_STAGES`."""
    return f"{row}.project_id IS NULL AND {row}.video_id IS NOT NULL AND {row}.stage IN ({_STAGE_LIST})"


# What each trigger function notes: the videos of the rows its statement changed (`changed`, and
# for an update `before`, the same rows as they were).
_FUNCTIONS = {
    "note_video_item_changes": f"SELECT DISTINCT c.video_id FROM changed c WHERE {_video_items('c')}",
    "note_video_item_updates": f"""
        SELECT DISTINCT n.video_id FROM changed n JOIN before b ON b.id = n.id
         WHERE {_video_items("n")}
           AND (b.status, b.finished_at) IS DISTINCT FROM (n.status, n.finished_at)""",
    "note_linked_videos": "SELECT DISTINCT video_id FROM changed",
    "note_video_updates": """
        SELECT n.video_id FROM changed n JOIN before b ON b.video_id = n.video_id
         WHERE (b.duration_s, b.size_bytes) IS DISTINCT FROM (n.duration_s, n.size_bytes)""",
}

# (table, event, function, transition tables)
_TRIGGERS = [
    ("work_items", "INSERT", "note_video_item_changes", "NEW TABLE AS changed"),
    ("work_items", "UPDATE", "note_video_item_updates", "OLD TABLE AS before NEW TABLE AS changed"),
    ("work_items", "DELETE", "note_video_item_changes", "OLD TABLE AS changed"),
    ("project_videos", "INSERT", "note_linked_videos", "NEW TABLE AS changed"),
    ("videos", "UPDATE", "note_video_updates", "OLD TABLE AS before NEW TABLE AS changed"),
]

_PROGRESS_COLUMNS = [
    *(
        column
        for stage in _STAGES
        for column in (
            sa.Column(f"{stage}_status", sa.Text),
            sa.Column(f"{stage}_finished_at", sa.DateTime(timezone=True)),
        )
    ),
    sa.Column("duration_s", sa.Float),
    sa.Column("size_bytes", sa.BigInteger),
]


def upgrade() -> None:
    op.create_table(
        "video_changes",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("video_id", sa.Text, nullable=False),
        schema=_S,
    )
    for column in _PROGRESS_COLUMNS:
        op.add_column("project_videos", column, schema=_S)
    for function, videos in _FUNCTIONS.items():
        op.execute(f"""
            CREATE FUNCTION {_S}.{function}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {_S}.video_changes (video_id) {videos};
                RETURN NULL;
            END $$""")
    for table, event, function, transitions in _TRIGGERS:
        op.execute(f"""
            CREATE TRIGGER {table}_{event.lower()}_notes_videos
             AFTER {event} ON {_S}.{table} REFERENCING {transitions}
             FOR EACH STATEMENT EXECUTE FUNCTION {_S}.{function}()""")
    op.execute(
        f"INSERT INTO {_S}.video_changes (video_id)"
        f" SELECT DISTINCT video_id FROM {_S}.project_videos"
    )


def downgrade() -> None:
    for table, event, _, _ in _TRIGGERS:
        op.execute(f"DROP TRIGGER {table}_{event.lower()}_notes_videos ON {_S}.{table}")
    for function in _FUNCTIONS:
        op.execute(f"DROP FUNCTION {_S}.{function}()")
    for column in _PROGRESS_COLUMNS:
        op.drop_column("project_videos", column.name, schema=_S)
    op.drop_table("video_changes", schema=_S)
