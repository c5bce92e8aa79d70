"""The filter's SQL: a project video's frame counts in `project_videos`, the videos with frames
that passed (what dedup reads) and the videos it scored (what a calibration samples)."""

from __future__ import annotations

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA

S = SCHEMA


def record_filter(
    conn: sa.Connection, project_id: int, video_id: str, *, total: int, passed: int
) -> None:
    conn.execute(
        sa.text(f"""UPDATE {S}.project_videos SET frames_total = :t, frames_passed = :p, updated_at = now()
                     WHERE project_id = :project AND video_id = :v"""),
        {"t": total, "p": passed, "project": project_id, "v": video_id},
    )


def videos_with_passed_frames(engine: sa.Engine, project_id: int) -> list[str]:
    return _videos_with_frames(engine, project_id, "frames_passed")


def filtered_videos(engine: sa.Engine, project_id: int) -> list[str]:
    """The project's videos whose frames the filter has scored (a copy of another video has no
    table of its own: its original's stands for it)."""
    return _videos_with_frames(engine, project_id, "frames_total")


def _videos_with_frames(engine: sa.Engine, project_id: int, count_column: str) -> list[str]:
    """The project's videos, by id, whose `count_column` of `project_videos` is above 0."""
    with engine.connect() as c:
        return list(
            c.execute(
                sa.text(f"""SELECT video_id FROM {S}.project_videos WHERE project_id = :p
                               AND {count_column} > 0 ORDER BY video_id"""),
                {"p": project_id},
            ).scalars()
        )
