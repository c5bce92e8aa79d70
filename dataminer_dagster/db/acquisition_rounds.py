"""Acquisition toward a target: the rounds of a project with `target.images`, and why they stop.

When such a project completes, the work sensor's cycle (and `dataminer run`) decides once per
dataset build, and again when the target changes (`continue_acquisition`): the target is reached, the budget is spent (max_videos,
max_download_hours, max_download_gb), the sources are exhausted (the last round found no video
the project had not seen, or max_rounds rounds were made), or a new round starts: its sources are
listed deeper (a refresh) and the catalog takes the videos assets/catalog/source_choice.py chooses. The state
is kept in `projects.acquisition` and shown by `dataminer status` and the dataset's metadata.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DONE, SCHEMA
from dataminer_dagster.db.source_refresh import request_refresh
from dataminer_dagster.db.video_totals import VideoTotals, video_totals
from dataminer_dagster.registry import DATASET

S = SCHEMA
ACQUIRING, REACHED, BUDGET, EXHAUSTED = "acquiring", "reached", "budget spent", "exhausted"


@dataclass(frozen=True)
class Spent:
    videos: int  # linked to the project (copies count once)
    downloaded: int
    hours: float  # of downloaded video
    gigabytes: float


def acquisition_state(conn: sa.Connection, project_id: int) -> dict:
    state = conn.execute(
        sa.text(f"SELECT acquisition FROM {S}.projects WHERE id = :p"), {"p": project_id}
    ).scalar()
    return state or {"round": 0, "state": ACQUIRING, "reason": "the first listing"}


def spent(conn: sa.Connection, project_id: int) -> Spent:
    return spent_of(video_totals(conn, project_id, ()))


def spent_of(videos: VideoTotals) -> Spent:
    """What the project's sources have spent: videos linked (copies count once, as their
    original), downloaded, hours and gigabytes downloaded."""
    found = videos.found
    return Spent(
        videos=sum(s.videos for s in found),
        downloaded=sum(s.downloaded for s in found),
        hours=sum(s.downloaded_s for s in found) / 3600.0,
        gigabytes=sum(s.downloaded_bytes for s in found) / 1e9,
    )


def budget_left(target: dict, used: Spent) -> tuple[int | None, str | None]:
    """(videos the budget still allows, None: no cap; why the budget is spent, or None)."""
    if target.get("max_videos") is not None and used.videos >= target["max_videos"]:
        return 0, f"max_videos ({target['max_videos']}) linked"
    if target.get("max_download_hours") is not None and used.hours >= target["max_download_hours"]:
        return 0, f"max_download_hours ({target['max_download_hours']:g}) downloaded"
    if target.get("max_download_gb") is not None and used.gigabytes >= target["max_download_gb"]:
        return 0, f"max_download_gb ({target['max_download_gb']:g}) downloaded"
    if target.get("max_videos") is not None:
        return target["max_videos"] - used.videos, None
    return None, None


def record_round(conn: sa.Connection, project_id: int, round_: int, new_videos: int) -> None:
    """A catalog run of a target project linked `new_videos`; a later round that found none
    means the sources are exhausted."""
    if round_ >= 1 and new_videos == 0:
        _save(
            conn,
            project_id,
            round_,
            EXHAUSTED,
            "the sources list no video the project has not seen",
        )


def continue_acquisition(store: LeaseStore) -> list[tuple[str, str]]:
    """For every complete project with a target whose dataset was built since the last decision,
    or whose target changed since (a raised `target.images` starts a round at once): the
    decision (see the module's docstring). Returns (project, the decision in words)."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"""
                SELECT p.id, p.name, p.config -> 'target' AS target, p.acquisition,
                       (w.outcome ->> 'images')::int AS images, w.finished_at
                  FROM {S}.projects p
                  JOIN {S}.work_items w ON w.stage = '{DATASET}' AND w.item_key = p.name
                                       AND w.status = '{DONE}'
                 WHERE p.stage = 'complete' AND jsonb_typeof(p.config -> 'target') = 'object'
                   AND (coalesce((p.acquisition ->> 'decided_at')::timestamptz, '-infinity')
                            < w.finished_at
                        OR p.acquisition -> 'target' IS DISTINCT FROM p.config -> 'target')
            """)
        ).all()
    return [(row.name, _decide(store, row)) for row in rows]


def _decide(store: LeaseStore, row) -> str:
    target, state = row.target, row.acquisition or {"round": 0, "state": ACQUIRING}
    round_ = int(state.get("round", 0))
    # Exhausted sources are tried once more under a changed target (a refresh may find more).
    retarget = state.get("target") not in (None, target)
    with store.engine.begin() as conn:
        used = spent(conn, row.id)
        _, spent_reason = budget_left(target, used)
        if (row.images or 0) >= target["images"]:
            decision = (
                REACHED,
                f"the dataset holds {row.images} images (target {target['images']})",
            )
        elif spent_reason is not None:
            decision = (BUDGET, spent_reason)
        elif state.get("state") == EXHAUSTED and not retarget:
            decision = (EXHAUSTED, state.get("reason", "the sources are exhausted"))
        elif round_ >= target.get("max_rounds", 20):
            decision = (EXHAUSTED, f"max_rounds ({round_}) made")
        else:
            decision = None
        if decision is not None:
            _save(conn, row.id, round_, *decision, decided_at=row.finished_at, target=target)
            return f"acquisition {decision[0]}: {decision[1]}"
        _save(
            conn,
            row.id,
            round_ + 1,
            ACQUIRING,
            f"round {round_ + 1}: {row.images or 0} of {target['images']} images",
            decided_at=row.finished_at,
            target=target,
        )
    request_refresh(store, row.id, row.name)
    return f"acquisition round {round_ + 1}: {row.images or 0} of {target['images']} images"


def _save(
    conn, project_id: int, round_: int, state: str, reason: str, *, decided_at=None, target=None
) -> None:
    """Keep the acquisition's state; a decision also keeps when it was made and under which
    target."""
    value = {"round": round_, "state": state, "reason": reason}
    if decided_at is not None:
        value["decided_at"] = decided_at.isoformat()
    if target is not None:
        value["target"] = target
    conn.execute(
        sa.text(f"""UPDATE {S}.projects SET acquisition = coalesce(acquisition, '{{}}') || CAST(:a AS jsonb)
                     WHERE id = :p"""),
        {"p": project_id, "a": json.dumps(value)},
    )


def target_report(
    engine: sa.Engine, project_id: int, target: dict | None, images: int, used: Spent
) -> dict | None:
    """Where the project stands against its target (None without one): `images` in its dataset,
    the round, the state and why, and what it has spent (`used`)."""
    if target is None:
        return None
    with engine.connect() as conn:
        state = acquisition_state(conn, project_id)
    return {
        "images": target["images"],
        "dataset_images": images,
        "round": state.get("round", 0),
        "state": state.get("state", ACQUIRING),
        "reason": state.get("reason"),
        "videos": used.videos,
        "downloaded": used.downloaded,
        "download_hours": round(used.hours, 3),
        "download_gb": round(used.gigabytes, 3),
        "budget": {
            k: target.get(k) for k in ("max_videos", "max_download_hours", "max_download_gb")
        },
    }
