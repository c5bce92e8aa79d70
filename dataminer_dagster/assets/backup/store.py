"""The backup's SQL: where a video's frames were copied, in `videos`."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA

S = SCHEMA


def record_backup(conn: sa.Connection, video_id: str, destinations: Sequence[str]) -> None:
    conn.execute(
        sa.text(f"""UPDATE {S}.videos SET backup_dest = :d, backed_up_at = now(), updated_at = now()
                     WHERE video_id = :v"""),
        {"d": "\n".join(destinations), "v": video_id},
    )
