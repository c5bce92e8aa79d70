"""The catalog rows behind Dagster's partition sets: each set's keys as the claim tables hold
them, for discovery (new rows become partitions) and for comparing the two.

A project video's key is built in SQL by `project_video_key_sql`, as `project_video_key` builds
it in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA, project_video_key_sql
from dataminer_dagster.engine.registry import PROJECT_VIDEOS, PROJECTS, VIDEOS

S = SCHEMA

# partitions name -> the query of (id, key) of its rows.
_KEYS = {
    PROJECTS: f"SELECT id, name AS key FROM {S}.projects",
    VIDEOS: f"SELECT id, video_id AS key FROM {S}.videos",
    PROJECT_VIDEOS: f"""SELECT pv.id, {project_video_key_sql("p.name", "pv.video_id")} AS key
                          FROM {S}.project_videos pv JOIN {S}.projects p ON p.id = pv.project_id""",
}
PARTITION_SETS = tuple(_KEYS)  # in discovery order
# partitions name -> its table, whose rows are the set's (a project video's project exists).
_TABLES = {PROJECTS: "projects", VIDEOS: "videos", PROJECT_VIDEOS: "project_videos"}


def rows_after(conn: sa.Connection, partitions: str, after: int, limit: int) -> list[sa.Row]:
    """(id, key) of the set's rows with an id above `after`, in id order, at most `limit`."""
    return conn.execute(
        sa.text(f"SELECT * FROM ({_KEYS[partitions]}) q WHERE id > :after ORDER BY id LIMIT :n"),
        {"after": after, "n": limit},
    ).all()


def all_keys(conn: sa.Connection, partitions: str) -> list[str]:
    """Every key of the set, in id order."""
    return list(
        conn.execute(sa.text(f"SELECT key FROM ({_KEYS[partitions]}) q ORDER BY id")).scalars()
    )


# Past this many deltas of one table, a reader folds them into one (row_counts, migration 0012).
FOLD_COUNTS_PAST = 1000


def row_count(conn: sa.Connection, partitions: str) -> int:
    """How many rows the set has: the sum of its table's deltas, which triggers append with each
    statement that inserts or deletes rows (a count(*) read every row: 0.3-0.6 s at 1M)."""
    table = _TABLES[partitions]
    total, deltas = conn.execute(
        sa.text(f"""SELECT coalesce(sum(delta), 0), count(*) FROM {S}.row_counts
                     WHERE table_name = :t"""),
        {"t": table},
    ).one()
    if deltas > FOLD_COUNTS_PAST:
        _fold_counts(conn, table)
    return int(total)


def _fold_counts(conn: sa.Connection, table: str) -> None:
    """The table's deltas folded into one row, in a transaction of its own. A delta committed
    meanwhile is not seen by the delete, so it stays; two folds at once delete each row once."""
    with conn.engine.begin() as fold:
        fold.execute(
            sa.text(f"""WITH gone AS (DELETE FROM {S}.row_counts WHERE table_name = :t
                                      RETURNING delta)
                        INSERT INTO {S}.row_counts (table_name, delta)
                        SELECT :t, sum(delta) FROM gone HAVING count(*) > 0"""),
            {"t": table},
        )


def projects_of_videos(engine: sa.Engine, video_ids: Sequence[str]) -> set[str]:
    """The names of the projects these videos belong to."""
    with engine.connect() as c:
        return set(
            c.execute(
                sa.text(f"""SELECT DISTINCT p.name FROM {S}.project_videos pv
                             JOIN {S}.projects p ON p.id = pv.project_id
                            WHERE pv.video_id = ANY(CAST(:keys AS text[]))"""),
                {"keys": list(video_ids)},
            ).scalars()
        )
