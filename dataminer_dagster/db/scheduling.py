"""Which work items a sensor should ask runs for, and the note that it did.

`requested_at` keeps a sensor from asking twice for the same item while the run it requested is
queued or starting; after `rerequest_after_s` without a claim (the run never started, or was lost)
the item is asked for again. A duplicate run is harmless: it finds the items claimed and leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.db.schema import FAILED, PENDING, SCHEMA

W = f"{SCHEMA}.work_items"


@dataclass(frozen=True)
class Requestable:
    id: int
    key: str


def requestable(
    engine: sa.Engine, stage: str, limit: int, rerequest_after_s: float
) -> list[Requestable]:
    statement = sa.text(f"""
        SELECT id, item_key FROM {W}
         WHERE stage = :stage AND status IN ('{PENDING}', '{FAILED}') AND next_attempt_at <= now()
           AND (requested_at IS NULL OR requested_at < now() - make_interval(secs => :again))
         ORDER BY next_attempt_at, id LIMIT :limit
    """)
    with engine.connect() as c:
        rows = c.execute(
            statement, {"stage": stage, "limit": limit, "again": rerequest_after_s}
        ).all()
    return [Requestable(r.id, r.item_key) for r in rows]


def mark_requested(engine: sa.Engine, ids: Sequence[int]) -> None:
    if ids:
        with engine.begin() as c:
            c.execute(
                sa.text(
                    f"UPDATE {W} SET requested_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))"
                ),
                {"ids": list(ids)},
            )


def clear_requested(engine: sa.Engine, stage: str, first_id: int, last_id: int) -> int:
    """Make the unclaimed items of a failed or cancelled run requestable again at once."""
    with engine.begin() as c:
        return c.execute(
            sa.text(f"""UPDATE {W} SET requested_at = NULL WHERE stage = :stage AND id BETWEEN :a AND :b
                          AND status IN ('{PENDING}', '{FAILED}') RETURNING id"""),
            {"stage": stage, "a": first_id, "b": last_id},
        ).rowcount


def next_due(engine: sa.Engine) -> float | None:
    """Seconds until the next waiting item becomes claimable (negative: overdue); None if none."""
    with engine.connect() as c:
        seconds = c.execute(
            sa.text(f"""SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM {W}
                         WHERE status IN ('{PENDING}', '{FAILED}')""")
        ).scalar()
    return None if seconds is None else float(seconds)
