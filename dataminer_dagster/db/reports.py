"""What progress bars and `dataminer status` show: work items per stage and status, per project;
frames kept at each stage; throughput and ETA; the data of the status tables.

Throughput is the number of a project's items that finished (done, dead or blocked) per minute
over the last `window_minutes`, from `work_items.finished_at`; the ETA divides the items still to
do (pending, running, failed and waiting for a retry) by it. Only queued items count: a video's
extraction is queued once its download is done, so early on the ETA of later stages is low.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.core.redact import redact, redact_url
from dataminer_dagster.db.acquisition_rounds import target_report
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import (
    BLOCKED,
    DEAD,
    DONE,
    FAILED,
    LINKED_THROUGH_COPY,
    PENDING,
    RUNNING,
    SCHEMA,
    STATUSES,
    stale_sql,
    troubled_sql,
)
from dataminer_dagster.db.source_refresh import last_listings, source_states
from dataminer_dagster.engine.registry import DOWNLOAD
from dataminer_dagster.settings import LongRunningPolicy

S = SCHEMA


def _board_video_stages() -> list[str]:
    """The per-video stages of the board: a project's videos' items that its status counts."""
    return [stage for stage in REGISTRY.member_board if REGISTRY[stage].per_video]


def _project_work(columns: str, *, project_only: str = "", video_only: str = "") -> str:
    """`columns` of the work items that concern project :p: its own (`project_id`) and its
    videos' downloads and extractions (`:video_stages`, through `project_videos`). Two indexed
    reads joined by UNION ALL (a video's items have no project, so none is counted twice): the
    cost follows the project's size, never the catalog's (an `OR ... IN (subquery)` became a
    plain SubPlan over the whole of project_videos past `work_mem`, issue 25). `project_only`
    and `video_only` end the columns of each branch (one more column, its value in each)."""
    return f"""
        SELECT {columns}{project_only} FROM {S}.work_items w
          JOIN {S}.projects p ON p.id = w.project_id
         WHERE w.project_id = :p
        UNION ALL
        SELECT {columns}{video_only} FROM {S}.project_videos pv
          JOIN {S}.work_items w ON w.video_id = pv.video_id
         WHERE pv.project_id = :p AND w.project_id IS NULL
           AND w.stage = ANY(CAST(:video_stages AS text[]))"""


def stage_counts(engine: sa.Engine, project_id: int) -> dict[str, dict[str, int]]:
    """{stage: {status: count}} of the work that concerns one project (its videos' downloads and
    extractions, its filters, its project stages)."""
    statement = sa.text(f"""
        SELECT stage, status, count(*) AS n FROM ({_project_work("w.stage, w.status")}) work
         GROUP BY 1, 2
    """)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    with engine.connect() as c:
        for row in c.execute(statement, {"p": project_id, "video_stages": _board_video_stages()}):
            counts[row.stage][row.status] = row.n
    return dict(counts)


@dataclass(frozen=True)
class WorkSummary:
    """The work that concerns one project, read in one pass over its items (a pass costs what
    the project is large: bench/README.md, "Scale")."""

    counts: dict[str, dict[str, int]]  # {stage: {status: items}}
    finished: dict[str, int]  # {stage: items finished in the window}
    stale: dict[str, int]  # {stage: items last claimed under an earlier config}


def work_summary(engine: sa.Engine, project_id: int, window_minutes: float) -> WorkSummary:
    """Items per stage and status, those that finished (done, dead or blocked) in the last
    `window_minutes`, and those a config change made stale: done or queued, they run again (a
    running one is queued again when it completes; only a project's own items have a config)."""
    statement = sa.text(f"""
        SELECT stage, status, count(*) AS n,
               count(*) FILTER (WHERE status IN ('{DONE}', '{DEAD}', '{BLOCKED}')
                                  AND finished_at > now() - make_interval(secs => :window_s))
                 AS finished,
               count(*) FILTER (WHERE stale) AS stale
          FROM ({
        _project_work(
            "w.stage, w.status, w.finished_at",
            project_only=f", {stale_sql('w', 'p.fingerprints ->> w.stage')} AS stale",
            video_only=", false AS stale",
        )
    }) work
         GROUP BY 1, 2
    """)
    params = {
        "p": project_id,
        "window_s": window_minutes * 60.0,
        "video_stages": _board_video_stages(),
    }
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    finished: dict[str, int] = defaultdict(int)
    stale: dict[str, int] = defaultdict(int)
    with engine.connect() as c:
        for row in c.execute(statement, params):
            counts[row.stage][row.status] = row.n
            finished[row.stage] += row.finished
            stale[row.stage] += row.stale
    return WorkSummary(
        counts=dict(counts),
        finished={stage: n for stage, n in finished.items() if n},
        stale={stage: stale[stage] for stage in REGISTRY.names if stale.get(stage)},
    )


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


_FAILURE_COLUMNS = "w.stage, w.item_key, w.status, w.attempts, w.last_error, w.updated_at"


def recent_failures(engine: sa.Engine, project_id: int, limit: int = 10) -> list[sa.Row]:
    """The project's latest items that failed, died or were blocked, with their errors: its own
    and its videos'. Each side walks its failures newest first (`work_items_troubled_own`,
    `work_items_troubled_videos`, migration 0013) and stops at `limit`, so a project of a million
    videos costs its ten failures, not its videos."""
    troubled = troubled_sql("w.")
    statement = sa.text(f"""
        SELECT * FROM (
            (SELECT {_FAILURE_COLUMNS} FROM {S}.work_items w
              WHERE w.project_id = :p AND {troubled}
              ORDER BY w.updated_at DESC LIMIT :n)
            UNION ALL
            (SELECT {_FAILURE_COLUMNS} FROM {S}.work_items w
              WHERE w.project_id IS NULL AND {troubled}
                AND EXISTS (SELECT FROM {S}.project_videos pv
                             WHERE pv.project_id = :p AND pv.video_id = w.video_id)
              ORDER BY w.updated_at DESC LIMIT :n)
        ) failures ORDER BY updated_at DESC LIMIT :n
    """)
    with engine.connect() as c:
        return c.execute(statement, {"p": project_id, "n": limit}).all()


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


def stage_progress(
    summary: WorkSummary, stages: tuple[str, ...], window_minutes: float
) -> list[StageProgress]:
    """Counts, throughput and ETA of each of `stages` (in that order), from a project's work
    summary over `window_minutes`."""
    result = []
    for stage in stages:
        statuses = summary.counts.get(stage) or dict.fromkeys(STATUSES, 0)
        recent = summary.finished.get(stage, 0)
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


def project_status(
    catalog: Catalog, project: ProjectRow, window: float, long_running: LongRunningPolicy
) -> dict:
    """What `dataminer status PROJECT` shows (and prints as JSON): work items, throughput and ETA
    per stage of the board, the work a config change made stale, frames kept at each stage, the
    videos that are copies of another (processed as it), latest failures, long-running items."""
    engine = catalog.engine
    if window <= 0:
        raise ValueError(f"the throughput window must be positive, got {window}")
    summary = work_summary(engine, project.id, window)
    stages = [
        {
            "stage": p.stage,
            **p.counts,
            "finished_in_window": p.finished_in_window,
            "per_minute": round(p.per_minute, 3),
            "eta_s": None if p.eta_s is None else round(p.eta_s, 1),
        }
        for p in stage_progress(summary, REGISTRY.board, window)
    ]
    failures = [
        {
            "stage": f.stage,
            "item": f.item_key,
            "status": f.status,
            "attempts": f.attempts,
            "error": f.last_error,
            "at": f.updated_at.isoformat(timespec="seconds"),
        }
        for f in recent_failures(engine, project.id)
    ]
    long_running = [
        {
            "stage": held.stage,
            "item": held.key,
            "run": held.owner,
            "running_s": round(held.held_s, 1),
            "usual_s": None if held.usual_s is None else round(held.usual_s, 1),
            "message": held.describe(),
        }
        for held in catalog.store.long_running(long_running, project.id)
    ]
    copies = [
        {
            "video": r.video_id,
            "source": redact_url(r.url) if r.url else r.source_path,
            "same_as": r.same_as,
            "original_source": redact_url(r.original_url) if r.original_url else r.original_path,
        }
        for r in catalog.project_copies(project.id)
    ]
    frames = frame_counts(engine, project.id)
    return {
        "project": project.name,
        "stage": project.stage,
        "error": project.error,
        "output_dir": str(project.output_dir),
        "videos": catalog.member_counts().get(project.id, 0),
        "refresh": refresh_report(engine, project),
        "target": target_report(
            engine,
            project.id,
            project.config.target.model_dump() if project.config.target else None,
            frames["in_dataset"],
        ),
        "sources": [
            {
                "source": redact(state.source),
                "listed_at": _iso(state.listed_at),
                "videos_listed": state.videos_listed,
                "videos_new": state.videos_new,
                "failures": state.failures,
                "error": state.last_error,
                "retry_at": _iso(state.retry_at),
            }
            for state in source_states(engine, project.id)
        ],
        "yield": source_yield(engine, project.id),
        "copies": copies,
        "window_minutes": window,
        "stages": stages,
        "stale": summary.stale,
        "frames": frames,
        "failures": failures,
        "long_running": long_running,
    }


def overview(catalog: Catalog) -> list[dict]:
    """What `dataminer status` shows: per project its state, videos and work items per stage."""
    counts = catalog.member_counts()
    result = []
    for p in catalog.projects():
        stages = stage_counts(catalog.engine, p.id)
        result.append(
            {
                "project": p.name,
                "stage": p.stage,
                "error": p.error,
                "videos": counts.get(p.id, 0),
                "output_dir": str(p.output_dir),
                "stages": stages,
            }
        )
    return result


def item_state(engine: sa.Engine, stage: str, key: str) -> sa.Row | None:
    """The work item of `stage` for `key` (status, attempts, last error); None: there is none."""
    with engine.connect() as c:
        return c.execute(
            sa.text(
                f"SELECT status, attempts, last_error FROM {S}.work_items"
                " WHERE stage = :stage AND item_key = :key"
            ),
            {"stage": stage, "key": key},
        ).first()


def refresh_report(engine: sa.Engine, project: ProjectRow) -> dict | None:
    """The project's refresh schedule: its cron and when its sources were last listed (None: no
    schedule). The CLI adds when they are listed next (engine/refresh_schedule.py)."""
    schedule = project.config.inputs.refresh
    if schedule is None:
        return None
    _, _, last = last_listings(engine).get(project.name, (None, None, None))
    return {
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "last_listed_at": _iso(last),
    }


def _iso(moment) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def source_yield(engine: sa.Engine, project_id: int, *, redacted: bool = True) -> list[dict]:
    """Per source of the project's videos (a search, a listing, a URL file, the config's URLs,
    a files pattern, add-video): videos linked and downloaded, minutes downloaded, frames
    extracted, passed by the filter and kept by dedup, and kept frames per downloaded video and
    per downloaded minute; the best yield per video first. A video found by two sources counts for the first."""
    statement = sa.text(f"""
        SELECT pv.source, pv.source_info, count(*) AS videos,
               count(*) FILTER (WHERE d.status = '{DONE}') AS downloaded,
               coalesce(sum(v.duration_s) FILTER (WHERE d.status = '{DONE}'), 0) / 60.0 AS minutes,
               coalesce(sum(pv.frames_total), 0) AS extracted,
               coalesce(sum(pv.frames_passed), 0) AS passed,
               coalesce(sum(pv.frames_kept), 0) AS kept
          FROM {S}.project_videos pv
          JOIN {S}.videos v ON v.video_id = pv.video_id
          LEFT JOIN {S}.work_items d ON d.stage = '{DOWNLOAD}' AND d.item_key = pv.video_id
         WHERE pv.project_id = :p AND pv.source <> '{LINKED_THROUGH_COPY}'
         GROUP BY 1, 2
    """)
    with engine.connect() as c:
        rows = c.execute(statement, {"p": project_id}).all()
    found = [
        {
            "source": (redact if redacted else str)(f"{r.source}: {r.source_info}"),
            "videos": r.videos,
            "downloaded": r.downloaded,
            "downloaded_minutes": round(float(r.minutes), 2),
            "frames_extracted": int(r.extracted),
            "frames_passed": int(r.passed),
            "frames_kept": int(r.kept),
            "kept_per_video": round(int(r.kept) / r.downloaded, 2) if r.downloaded else None,
            "kept_per_minute": round(int(r.kept) / float(r.minutes), 2) if r.minutes else None,
        }
        for r in rows
    ]
    # Downloads are what acquisition spends (core/acquisition.py): the best kept per video first.
    return sorted(found, key=lambda y: (-(y["kept_per_video"] or 0), y["source"]))
