"""Throughput and ETA per stage for `dataminer status`.

Throughput is the number of a project's items that finished (done, dead or blocked) per minute
over the last `window_minutes`, from `work_items.finished_at`; the ETA divides the items still to
do (pending, running, failed and waiting for a retry) by it. Only queued items count: a video's
extraction is queued once its download is done, so early on the ETA of later stages is low.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.db.schema import (
    BLOCKED,
    DEAD,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SCHEMA,
    STATUSES,
)
from dataminer_dagster.db.status import stage_counts
from dataminer_dagster.stages import DOWNLOAD, FRAMES

S = SCHEMA
DEFAULT_WINDOW_MINUTES = 15.0
REMAINING = (PENDING, RUNNING, FAILED)


@dataclass(frozen=True)
class StageProgress:
    stage: str
    counts: dict[str, int]  # status -> items
    finished_in_window: int
    per_minute: float
    eta_s: float | None  # 0 when nothing is left; None when work is left but nothing finished

    @property
    def remaining(self) -> int:
        return sum(self.counts.get(s, 0) for s in REMAINING)


def finished_in_window(engine: sa.Engine, project_id: int, window_minutes: float) -> dict[str, int]:
    """{stage: items finished in the last `window_minutes`}, for the work that concerns one
    project (the same items as db.status.stage_counts)."""
    statement = sa.text(f"""
        SELECT w.stage, count(*) AS n FROM {S}.work_items w
         WHERE w.status IN ('{DONE}', '{DEAD}', '{BLOCKED}')
           AND w.finished_at > now() - make_interval(secs => :window_s)
           AND (w.project_id = :p
                OR (w.stage IN ('{DOWNLOAD}', '{FRAMES}')
                    AND w.video_id IN (SELECT video_id FROM {S}.project_videos
                                        WHERE project_id = :p)))
         GROUP BY 1
    """)
    with engine.connect() as c:
        rows = c.execute(statement, {"p": project_id, "window_s": window_minutes * 60.0}).all()
    return {r.stage: r.n for r in rows}


def stage_progress(
    engine: sa.Engine,
    project_id: int,
    stages: tuple[str, ...],
    window_minutes: float = DEFAULT_WINDOW_MINUTES,
) -> list[StageProgress]:
    """Counts, throughput and ETA of each of `stages` (in that order) for one project."""
    if window_minutes <= 0:
        raise ValueError(f"the throughput window must be positive, got {window_minutes}")
    counts = stage_counts(engine, project_id)
    finished = finished_in_window(engine, project_id, window_minutes)
    result = []
    for stage in stages:
        statuses = counts.get(stage) or dict.fromkeys(STATUSES, 0)
        recent = finished.get(stage, 0)
        result.append(
            StageProgress(
                stage=stage,
                counts=dict(statuses),
                finished_in_window=recent,
                per_minute=recent / window_minutes,
                eta_s=eta_seconds(
                    sum(statuses.get(s, 0) for s in REMAINING), recent / window_minutes
                ),
            )
        )
    return result


def eta_seconds(remaining: int, per_minute: float) -> float | None:
    if remaining == 0:
        return 0.0
    if per_minute <= 0:
        return None
    return 60.0 * remaining / per_minute
