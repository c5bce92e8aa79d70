"""The catalog rows behind Dagster's partition sets: each set's keys as the claim tables hold
them, for discovery (new rows become partitions) and for comparing the two.

A project video's key is built in SQL by `project_video_key_sql`, as `project_video_key` builds
it in Python.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from dataminer_dagster.db.delta_counts import read_count
from dataminer_dagster.db.schema import SCHEMA, project_video_key_sql
from dataminer_dagster.registry import (
    PROJECT_VIDEOS,
    PROJECTS,
    VIDEOS,
    split_project_video_key,
)

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


def rows_before(conn: sa.Connection, partitions: str, before: int, limit: int) -> list[sa.Row]:
    """(id, key) of the set's rows with an id below `before`, newest first, at most `limit`."""
    return conn.execute(
        sa.text(
            f"SELECT * FROM ({_KEYS[partitions]}) q WHERE id < :before ORDER BY id DESC LIMIT :n"
        ),
        {"before": before, "n": limit},
    ).all()


def existing_keys(conn: sa.Connection, partitions: str, keys: Sequence[str]) -> set[str]:
    """Those of `keys` that the set's rows hold, each looked up by its table's key index."""
    if partitions == PROJECT_VIDEOS:
        pairs = [pair for pair in map(_split_or_none, keys) if pair]
        names, videos = [name for name, _ in pairs], [video for _, video in pairs]
        query = f"""SELECT {project_video_key_sql("p.name", "pv.video_id")}
                      FROM unnest(CAST(:names AS text[]), CAST(:videos AS text[])) k(name, video)
                      JOIN {S}.projects p ON p.name = k.name
                      JOIN {S}.project_videos pv
                        ON pv.project_id = p.id AND pv.video_id = k.video"""
        return set(conn.execute(sa.text(query), {"names": names, "videos": videos}).scalars())
    column = {PROJECTS: "name", VIDEOS: "video_id"}[partitions]
    query = f"SELECT {column} FROM {S}.{_TABLES[partitions]} WHERE {column} = ANY(CAST(:keys AS text[]))"
    return set(conn.execute(sa.text(query), {"keys": list(keys)}).scalars())


def _split_or_none(key: str) -> tuple[str, str] | None:
    try:
        return split_project_video_key(key)
    except ValueError:  # not a key the catalog makes: no row holds it
        return None


def row_count(conn: sa.Connection, partitions: str) -> int:
    """How many rows the set has, as the triggers of migration 0012 count them
    (db/delta_counts.py)."""
    return read_count(conn, f"{S}.row_counts", "table_name", _TABLES[partitions])


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
