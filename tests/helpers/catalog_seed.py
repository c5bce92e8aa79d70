"""A catalog filled in bulk, as far along as a long-running deployment's: videos linked to a
project, each with its download and extraction done and its filter queued. Written with
`generate_series` (a million rows in a minute), for the status plan test and bench/status.py."""

from __future__ import annotations

import sqlalchemy as sa

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.schema import project_video_key_sql

S = "dataminer"


def add_project(catalog: Catalog, name: str) -> int:
    """A project registered as `dataminer project add` registers it; its id."""
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"urls": ["https://videos.invalid/listed"]},
            "filter": {"positive_prompts": ["x"]},
        }
    )
    catalog.projects.register(config)
    return catalog.projects.get(name).id


def seed_videos(engine: sa.Engine, project_id: int, count: int, prefix: str) -> None:
    """`count` videos `<prefix><n>` linked to the project: download and frames done, filter
    pending (keyed as the filter keys a project video)."""
    params = {"p": project_id, "n": count, "prefix": prefix}
    statements = [
        f"""INSERT INTO {S}.videos (video_id, url)
            SELECT :prefix || g, 'https://videos.invalid/' || :prefix || g
              FROM generate_series(1, :n) g""",
        f"""INSERT INTO {S}.project_videos (project_id, video_id, source)
            SELECT :p, :prefix || g, 'url' FROM generate_series(1, :n) g""",
        f"""INSERT INTO {S}.work_items (stage, item_key, video_id, status, max_attempts, finished_at)
            SELECT stage, :prefix || g, :prefix || g, 'done', 4, now()
              FROM generate_series(1, :n) g, unnest(ARRAY['download', 'frames']) stage""",
        f"""INSERT INTO {S}.work_items (stage, item_key, project_id, video_id, status, max_attempts)
            SELECT 'filter', {project_video_key_sql("p.name", ":prefix || g")}, :p, :prefix || g,
                   'pending', 4
              FROM generate_series(1, :n) g, {S}.projects p WHERE p.id = :p""",
    ]
    with engine.begin() as c:
        for statement in statements:
            c.execute(sa.text(statement), params)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(sa.text(f"ANALYZE {S}.videos, {S}.project_videos, {S}.work_items"))


def catalog_keys(conn: sa.Connection, partitions: str) -> list[str]:
    """Every key of a partition set's catalog rows, in id order."""
    from dataminer_dagster.db.partition_rows import rows_after

    return [row.key for row in rows_after(conn, partitions, 0, 2**62)]
