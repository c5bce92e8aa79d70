"""project_changes: which projects' state changed since their stages were last advanced.

`advance_projects` (db/project_flow.py) moves a project from stage to stage from what its rows
hold: its own row, its member videos and their work items. It used to read every member of every
project on every call, a second a tick at 1,000,000 videos. Triggers now note, in the same
transaction as each change, the projects a statement touched; the next call reads only those
projects, then removes the notes it read. A note is written with its change, so a change
committed after a call read the notes is found by the next call; a call that stops half way
leaves its notes, and the next one reads them again. Every project is noted here once, so the
first call after the upgrade looks at each.

The triggers are per statement (one note per project a statement touched, not per row); an
update of a work item notes its projects only when something a project's state reads changed
(status, fingerprint, outcome), not when a sensor marks it requested.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_S = "dataminer"


def _projects_of_items(items: str) -> str:
    """The projects of the work items `items`: a project item's own, and every project that links
    a video item's video."""
    return f"""
        SELECT project_id FROM {items} WHERE project_id IS NOT NULL
        UNION
        SELECT pv.project_id FROM {items} i JOIN {_S}.project_videos pv ON pv.video_id = i.video_id
         WHERE i.project_id IS NULL AND i.video_id IS NOT NULL"""


# What each trigger function notes: the projects of the rows its statement changed (`changed`,
# and for an update of work items `before`, the same rows as they were).
_FUNCTIONS = {
    "note_item_changes": _projects_of_items("changed"),
    "note_item_updates": f"""
        WITH moved AS (
            SELECT n.* FROM changed n JOIN before b ON b.id = n.id
             WHERE (b.status, b.fingerprint, b.outcome) IS DISTINCT FROM (n.status, n.fingerprint, n.outcome))
        {_projects_of_items("moved")}""",
    "note_member_changes": "SELECT DISTINCT project_id FROM changed",
    "note_project_changes": "SELECT id FROM changed",
}

# (table, event, function, transition tables)
_TRIGGERS = [
    ("work_items", "INSERT", "note_item_changes", "NEW TABLE AS changed"),
    ("work_items", "UPDATE", "note_item_updates", "OLD TABLE AS before NEW TABLE AS changed"),
    ("work_items", "DELETE", "note_item_changes", "OLD TABLE AS changed"),
    ("project_videos", "INSERT", "note_member_changes", "NEW TABLE AS changed"),
    ("project_videos", "UPDATE", "note_member_changes", "NEW TABLE AS changed"),
    ("project_videos", "DELETE", "note_member_changes", "OLD TABLE AS changed"),
    ("projects", "INSERT", "note_project_changes", "NEW TABLE AS changed"),
    ("projects", "UPDATE", "note_project_changes", "NEW TABLE AS changed"),
]


def upgrade() -> None:
    op.create_table(
        "project_changes",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("project_id", sa.Integer, nullable=False),
        schema=_S,
    )
    for function, projects in _FUNCTIONS.items():
        op.execute(f"""
            CREATE FUNCTION {_S}.{function}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {_S}.project_changes (project_id) {projects};
                RETURN NULL;
            END $$""")
    for table, event, function, transitions in _TRIGGERS:
        op.execute(f"""
            CREATE TRIGGER {table}_{event.lower()}_notes_projects
             AFTER {event} ON {_S}.{table} REFERENCING {transitions}
             FOR EACH STATEMENT EXECUTE FUNCTION {_S}.{function}()""")
    op.execute(f"INSERT INTO {_S}.project_changes (project_id) SELECT id FROM {_S}.projects")


def downgrade() -> None:
    for table, event, _, _ in _TRIGGERS:
        op.execute(f"DROP TRIGGER {table}_{event.lower()}_notes_projects ON {_S}.{table}")
    for function in _FUNCTIONS:
        op.execute(f"DROP FUNCTION {_S}.{function}()")
    op.drop_table("project_changes", schema=_S)
