"""The dedup stage's SQL: how many frames of each of the project's videos dedup kept (the last
column of a source's yield, db/reports.py `source_yield`)."""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA

S = SCHEMA


def record_kept(conn: sa.Connection, project_id: int, kept: Mapping[str, int]) -> None:
    """`kept[video_id]` frames kept for each video; the project's other videos kept none."""
    conn.execute(
        sa.text(f"""
            UPDATE {S}.project_videos pv SET frames_kept = coalesce(k.n, 0)
              FROM {S}.project_videos p2
              LEFT JOIN unnest(CAST(:videos AS text[]), CAST(:counts AS int[])) AS k(video_id, n)
                ON k.video_id = p2.video_id
             WHERE pv.project_id = :p AND p2.project_id = :p AND p2.video_id = pv.video_id
               AND pv.frames_kept IS DISTINCT FROM coalesce(k.n, 0)
        """),
        {"p": project_id, "videos": list(kept), "counts": [int(n) for n in kept.values()]},
    )
