"""Which work items a sensor should ask runs for, the note that it did, and which work is coming.

`requested_at` keeps a sensor from asking twice for the same item while the run it requested is
queued or starting; after `rerequest_after_s` without a claim (the run never started, or was lost)
the item is asked for again; the work sensor, which knows the live runs, asks again sooner for an
item that no live run covers (engine/planning.py). A duplicate run is harmless: it finds the items
claimed and leaves.

Work is *in flight* when its item is running, or claimable and requested. A lane whose input is
produced by work in flight may be requested ahead (`coming`): its run starts meanwhile and waits
for that work (resources/ahead.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.db.lease_sql import CONCERNS_PROJECTS
from dataminer_dagster.db.project_flow import ACTIVE, MEMBER_FINISHED_SQL
from dataminer_dagster.db.schema import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SCHEMA,
    project_video_key_sql,
)
from dataminer_dagster.registry import CATALOG, DEDUP, DOWNLOAD, FILTER, FRAMES

S = SCHEMA
W = f"{SCHEMA}.work_items"
REREQUEST_AFTER_S = 900.0  # a requested item no run has claimed after this is asked for again


@dataclass(frozen=True)
class Requestable:
    id: int
    stage: str
    key: str


def requestable(
    engine: sa.Engine,
    stages: Sequence[str],
    limit: int,
    rerequest_after_s: float,
    projects: Sequence[int] | None = None,
    exclude_keys: Sequence[str] = (),
) -> list[Requestable]:
    """Items of `stages` that a run may be asked for (with `projects`, only those that concern
    one of these projects; never those of `exclude_keys`, e.g. covered by a live run), in due
    order. Each stage's items are walked in its own due order and the walk stops at `limit`
    (over all the stages at once, the index gives no order: every waiting item would be read
    and sorted on every tick)."""
    statement = sa.text(f"""
        SELECT id, stage, item_key FROM unnest(CAST(:stages AS text[])) AS wanted(stage_name)
         CROSS JOIN LATERAL (
            SELECT id, stage, item_key, next_attempt_at FROM {W}
             WHERE stage = wanted.stage_name AND status IN ('{PENDING}', '{FAILED}')
               AND next_attempt_at <= now()
               AND (requested_at IS NULL OR requested_at < now() - make_interval(secs => :again))
               AND {CONCERNS_PROJECTS}
               AND NOT item_key = ANY(CAST(:exclude AS text[]))
             ORDER BY next_attempt_at, id LIMIT :limit) due
         ORDER BY next_attempt_at, id LIMIT :limit
    """)
    params = {
        "exclude": list(exclude_keys),
        "stages": list(stages),
        "limit": limit,
        "again": rerequest_after_s,
        "projects": None if projects is None else list(projects),
    }
    with engine.connect() as c:
        rows = c.execute(statement, params).all()
    return [Requestable(r.id, r.stage, r.item_key) for r in rows]


def mark_requested(engine: sa.Engine, ids: Sequence[int]) -> None:
    if ids:
        with engine.begin() as c:
            c.execute(
                sa.text(
                    f"UPDATE {W} SET requested_at = now() WHERE id = ANY(CAST(:ids AS bigint[]))"
                ),
                {"ids": list(ids)},
            )


def clear_requested(engine: sa.Engine, stages: Sequence[str], first_id: int, last_id: int) -> int:
    """Make the unclaimed items of a failed or cancelled run requestable again at once."""
    with engine.begin() as c:
        return c.execute(
            sa.text(f"""UPDATE {W} SET requested_at = NULL
                         WHERE stage = ANY(CAST(:stages AS text[])) AND id BETWEEN :a AND :b
                           AND status IN ('{PENDING}', '{FAILED}') RETURNING id"""),
            {"stages": list(stages), "a": first_id, "b": last_id},
        ).rowcount


def next_due(engine: sa.Engine) -> float | None:
    """Seconds until the next waiting item becomes claimable (negative: overdue); None if none."""
    with engine.connect() as c:
        seconds = c.execute(
            sa.text(f"""SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM {W}
                         WHERE status IN ('{PENDING}', '{FAILED}')""")
        ).scalar()
    return None if seconds is None else float(seconds)


def claimable_keys(engine: sa.Engine, stage: str, keys: Sequence[str]) -> list[str]:
    """The keys among `keys` whose `stage` item can be claimed now."""
    with engine.connect() as c:
        return list(
            c.execute(
                sa.text(f"""SELECT item_key FROM {W}
                             WHERE stage = :stage AND item_key = ANY(CAST(:keys AS text[]))
                               AND status IN ('{PENDING}', '{FAILED}') AND next_attempt_at <= now()"""),
                {"stage": stage, "keys": list(keys)},
            ).scalars()
        )


# --- work coming from runs in flight --------------------------------------------------------------


def _in_flight(alias: str) -> str:
    """The item `alias` is running, or claimable and requested (recently, or in this very plan).
    `_FILTER_COMING` finds the same items as a set, each kind by its own index: a change to what
    counts as in flight is made in both."""
    return f"""({alias}.status = '{RUNNING}'
                OR ({alias}.status IN ('{PENDING}', '{FAILED}') AND {alias}.next_attempt_at <= now()
                    AND ({alias}.requested_at > now() - make_interval(secs => :again)
                         OR {alias}.id = ANY(CAST(:planned AS bigint[])))))"""


# A project video is coming to the filter when it has no filter item yet and its download or
# extraction is in flight. The items in flight are found first, each kind by its own index (a
# running item, one requested lately, one planned in this cycle by its id), their stage checked
# after, then their project videos looked up one by one, so that no statistics (stale after a
# bulk fill) can make the planner walk the claimable items or the project videos instead: the
# statement costs what is in flight, not the catalog (one OR over the items reads them all; with
# the catalog's statistics not yet updated after a bulk fill, the planner walks the project
# videos in queue order: bench/README.md, "Figures behind the code").
_FILTER_COMING = f"""
    WITH moving AS MATERIALIZED (
        SELECT item_key, stage FROM {W} WHERE status = '{RUNNING}'
        UNION
        SELECT item_key, stage FROM {W}
         WHERE requested_at > now() - make_interval(secs => :again)
           AND status IN ('{PENDING}', '{FAILED}') AND next_attempt_at <= now()
        UNION
        SELECT w.item_key, w.stage FROM unnest(CAST(:planned AS bigint[])) AS planned(id)
         CROSS JOIN LATERAL (SELECT item_key, stage, status, next_attempt_at FROM {W}
                              WHERE id = planned.id LIMIT 1) w  -- a lookup by id each
         WHERE w.status IN ('{PENDING}', '{FAILED}') AND w.next_attempt_at <= now())
    SELECT {project_video_key_sql("p.name", "pv.video_id")} AS key, pv.id AS position
      FROM (SELECT DISTINCT item_key FROM moving
             WHERE stage IN ('{DOWNLOAD}', '{FRAMES}')) m  -- a video's download and extraction
     CROSS JOIN LATERAL (SELECT id, project_id, video_id FROM {S}.project_videos
                          WHERE video_id = m.item_key OFFSET 0) pv  -- by its index, each
      JOIN {S}.projects p ON p.id = pv.project_id
     WHERE NOT EXISTS (SELECT 1 FROM {W} fi WHERE fi.stage = '{FILTER}'
                          AND fi.item_key = {project_video_key_sql("p.name", "pv.video_id")})
"""

# A project is coming to its project stages when its catalog is done, it is still active, and
# every member that is not finished has work in flight (none waits for a retry or for a request).
_PROJECT_COMING = f"""
    SELECT p.name AS key, p.id AS position
      FROM {S}.projects p
      JOIN {W} c ON c.stage = '{CATALOG}' AND c.item_key = p.name AND c.status = '{DONE}'
     WHERE p.stage = '{ACTIVE}'
       AND EXISTS (
            SELECT 1 FROM {S}.project_videos pv
              LEFT JOIN {W} fi ON fi.stage = '{FILTER}' AND fi.item_key = {project_video_key_sql("p.name", "pv.video_id")}
              LEFT JOIN {W} d ON d.stage = '{DOWNLOAD}' AND d.item_key = pv.video_id
              LEFT JOIN {W} f ON f.stage = '{FRAMES}' AND f.item_key = pv.video_id
             WHERE pv.project_id = p.id AND NOT {MEMBER_FINISHED_SQL})
       AND NOT EXISTS (
            SELECT 1 FROM {S}.project_videos pv
              LEFT JOIN {W} fi ON fi.stage = '{FILTER}' AND fi.item_key = {project_video_key_sql("p.name", "pv.video_id")}
              LEFT JOIN {W} d ON d.stage = '{DOWNLOAD}' AND d.item_key = pv.video_id
              LEFT JOIN {W} f ON f.stage = '{FRAMES}' AND f.item_key = pv.video_id
             WHERE pv.project_id = p.id AND NOT {MEMBER_FINISHED_SQL}
               AND NOT coalesce({_in_flight("fi")} OR {_in_flight("d")} OR {_in_flight("f")}, false))
"""

# By the first stage of a lane that may be requested ahead.
_COMING = {FILTER: _FILTER_COMING, DEDUP: _PROJECT_COMING}


def coming(
    engine: sa.Engine,
    first_stage: str,
    *,
    rerequest_after_s: float = REREQUEST_AFTER_S,
    keys: Sequence[str] | None = None,
    planned_ids: Sequence[int] = (),
    limit: int | None = None,
) -> list[str]:
    """Keys of `first_stage` whose item does not exist or cannot be claimed yet but will be,
    once work in flight finishes (items `planned_ids` count as requested), in queue order."""
    statement = sa.text(f"""
        SELECT key FROM ({_COMING[first_stage]}) q
         WHERE CAST(:keys AS text[]) IS NULL OR key = ANY(CAST(:keys AS text[]))
         ORDER BY position LIMIT :limit
    """)
    params = {
        "again": rerequest_after_s,
        "planned": list(planned_ids),
        "keys": list(keys) if keys is not None else None,
        "limit": limit,
    }
    with engine.connect() as c:
        return list(c.execute(statement, params).scalars())
