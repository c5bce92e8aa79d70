"""The video_frames table: each video's extracted frames, one row per extraction profile."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA
from dataminer_dagster.paths import DataPaths

S = SCHEMA


class FrameRecords:
    """The catalog's frames per video and profile (`Catalog.frames`)."""

    def __init__(self, engine: sa.Engine, paths: DataPaths):
        self.engine = engine
        self.paths = paths

    def profiles(self, video_ids: Iterable[str] | None) -> dict[str, dict[str, tuple[Path, int]]]:
        """{video_id: {profile_id: (absolute frames dir, frame count)}}; None: every video."""
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"""SELECT * FROM {S}.video_frames
                             WHERE CAST(:ids AS text[]) IS NULL OR video_id = ANY(CAST(:ids AS text[]))"""),
                {"ids": None if video_ids is None else list(video_ids)},
            ).all()
        result: dict[str, dict[str, tuple[Path, int]]] = defaultdict(dict)
        for r in rows:
            result[r.video_id][r.profile_id] = (self.paths.absolute(r.frames_dir), r.frame_count)
        return dict(result)

    def record(
        self,
        conn: sa.Connection,
        video_id: str,
        profile_id: str,
        options: dict,
        frames_dir: Path,
        count: int,
    ) -> None:
        """Record a video's frames of one extraction profile. Its backups no longer hold all its
        frames: they are forgotten, so that the backup runs again (rsync copies what is new)
        before any release may delete these frames (db/retention.py)."""
        conn.execute(
            sa.text(f"UPDATE {S}.videos SET backup_dest = NULL WHERE video_id = :v"),
            {"v": video_id},
        )
        conn.execute(
            sa.text(f"""
                INSERT INTO {S}.video_frames (video_id, profile_id, options, frames_dir, frame_count)
                VALUES (:v, :p, CAST(:o AS jsonb), :d, :n)
                ON CONFLICT (video_id, profile_id) DO UPDATE SET options = EXCLUDED.options,
                       frames_dir = EXCLUDED.frames_dir, frame_count = EXCLUDED.frame_count, updated_at = now()
            """),
            {
                "v": video_id,
                "p": profile_id,
                "o": json.dumps(options),
                "d": self.paths.relative(frames_dir),
                "n": count,
            },
        )

    def forget(self, conn: sa.Connection, video_id: str, profile_id: str | None = None) -> None:
        conn.execute(
            sa.text(
                f"DELETE FROM {S}.video_frames WHERE video_id = :v AND (CAST(:p AS text) IS NULL OR profile_id = :p)"
            ),
            {"v": video_id, "p": profile_id},
        )
