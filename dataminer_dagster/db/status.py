"""Counts for progress bars and `dataminer status`: work items per stage and status, per project."""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA, STATUSES
from dataminer_dagster.stages import DOWNLOAD, FRAMES

S = SCHEMA


def stage_counts(engine: sa.Engine, project_id: int) -> dict[str, dict[str, int]]:
    """{stage: {status: count}} of the work that concerns one project (its videos' downloads and
    extractions, its filters, its project stages)."""
    statement = sa.text(f"""
        SELECT w.stage, w.status, count(*) AS n FROM {S}.work_items w
         WHERE w.project_id = :p
            OR (w.stage IN ('{DOWNLOAD}', '{FRAMES}')
                AND w.video_id IN (SELECT video_id FROM {S}.project_videos WHERE project_id = :p))
         GROUP BY 1, 2
    """)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    with engine.connect() as c:
        for row in c.execute(statement, {"p": project_id}):
            counts[row.stage][row.status] = row.n
    return dict(counts)


def frame_counts(engine: sa.Engine, project_id: int) -> dict[str, int]:
    """Frames the project's filter looked at and kept, and what dedup and the dataset kept."""
    with engine.connect() as c:
        filtered = c.execute(
            sa.text(f"""SELECT coalesce(sum(frames_total), 0) AS total, coalesce(sum(frames_passed), 0) AS passed
                          FROM {S}.project_videos WHERE project_id = :p"""),
            {"p": project_id},
        ).one()
        outcomes = dict(
            c.execute(
                sa.text(f"""SELECT stage, outcome FROM {S}.work_items WHERE project_id = :p
                               AND stage IN ('dedup', 'dataset') AND status = 'done'"""),
                {"p": project_id},
            ).all()
        )
    return {
        "extracted": int(filtered.total),
        "passed_filter": int(filtered.passed),
        "kept_after_dedup": int((outcomes.get("dedup") or {}).get("kept", 0)),
        "in_dataset": int((outcomes.get("dataset") or {}).get("images", 0)),
    }


def recent_failures(engine: sa.Engine, project_id: int, limit: int = 10) -> list[sa.Row]:
    statement = sa.text(f"""
        SELECT w.stage, w.item_key, w.status, w.attempts, w.last_error, w.updated_at FROM {S}.work_items w
         WHERE w.status IN ('failed', 'dead', 'blocked') AND w.last_error IS NOT NULL
           AND (w.project_id = :p OR w.video_id IN (SELECT video_id FROM {S}.project_videos WHERE project_id = :p))
         ORDER BY w.updated_at DESC LIMIT :n
    """)
    with engine.connect() as c:
        return c.execute(statement, {"p": project_id, "n": limit}).all()
