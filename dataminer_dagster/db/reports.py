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
from dataminer_dagster.db.acquisition_rounds import spent_of, target_report
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import (
    FAILED,
    PENDING,
    RUNNING,
    SCHEMA,
    STATUSES,
    finished_since_sql,
    stale_sql,
    troubled_sql,
)
from dataminer_dagster.db.source_refresh import last_listings, source_states
from dataminer_dagster.db.video_totals import VideoTotals, video_totals
from dataminer_dagster.settings import LongRunningPolicy

S = SCHEMA


def _board_video_stages() -> list[str]:
    """The per-video stages of the board: a project's videos' items that its status counts."""
    return [stage for stage in REGISTRY.member_board if REGISTRY[stage].per_video]


def _project_work(columns: str) -> str:
    """`columns` of the work items that concern project :p: its own (`project_id`) and its
    videos' downloads and extractions (`:video_stages`, through `project_videos`). Two indexed
    reads joined by UNION ALL (a video's items have no project, so none is counted twice): the
    cost follows the project's size, never the catalog's (an `OR ... IN (subquery)` became a
    plain SubPlan over the whole of project_videos past `work_mem`, issue 25)."""
    return f"""
        SELECT {columns} FROM {S}.work_items w
         WHERE w.project_id = :p
        UNION ALL
        SELECT {columns} FROM {S}.project_videos pv
          JOIN {S}.work_items w ON w.video_id = pv.video_id
         WHERE pv.project_id = :p AND w.project_id IS NULL
           AND w.stage = ANY(CAST(:video_stages AS text[]))"""


def stage_counts(engine: sa.Engine, project_id: int) -> dict[str, dict[str, int]]:
    """{stage: {status: count}} of the work that concerns one project (its videos' downloads and
    extractions, its filters, its project stages): what `dataminer status` and the progress
    bars show of each project. Its status (`work_summary`) reads the same from the pass over the
    project's videos, which costs more (it joins the videos and each stage's items for the
    yield); tests/db/test_video_totals.py keeps the two equal."""
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
    """The work that concerns one project: its own items, and its videos' items of the board's
    per-video stages (read in the pass over its videos, kept here for the rest of its status)."""

    counts: dict[str, dict[str, int]]  # {stage: {status: items}}
    finished: dict[str, int]  # {stage: items finished in the window}
    stale: dict[str, int]  # {stage: items last claimed under an earlier config}
    videos: VideoTotals


def work_summary(engine: sa.Engine, project_id: int, window_minutes: float) -> WorkSummary:
    """Items per stage and status, those that finished (done, dead or blocked) in the last
    `window_minutes`, and those a config change made stale: done or queued, they run again (a
    running one is queued again when it completes; only a project's own items have a config)."""
    # The fingerprints read once (an InitPlan), not joined per item: a join keeps the read of a
    # large project's filter items on one core, where without it PostgreSQL reads in parallel.
    fingerprints = f"SELECT fingerprints FROM {S}.projects WHERE id = :p"
    own = sa.text(f"""
        SELECT w.stage, w.status, count(*) AS n,
               count(*) FILTER (WHERE {finished_since_sql("w")}) AS finished,
               count(*) FILTER (WHERE {stale_sql("w", f"({fingerprints}) ->> w.stage")}) AS stale
          FROM {S}.work_items w
         WHERE w.project_id = :p
         GROUP BY 1, 2
    """)
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    finished: dict[str, int] = defaultdict(int)
    stale: dict[str, int] = defaultdict(int)
    with engine.connect() as c:
        videos = video_totals(c, project_id, _board_video_stages(), window_minutes)
        rows = c.execute(own, {"p": project_id, "window_s": window_minutes * 60.0}).all()
    for stage, statuses in videos.counts.items():
        counts[stage].update(statuses)
        finished[stage] += videos.finished[stage]
    for row in rows:
        counts[row.stage][row.status] += row.n
        finished[row.stage] += row.finished
        stale[row.stage] += row.stale
    return WorkSummary(
        counts={stage: statuses for stage, statuses in counts.items() if any(statuses.values())},
        finished={stage: n for stage, n in finished.items() if n},
        stale={stage: stale[stage] for stage in REGISTRY.names if stale.get(stage)},
        videos=videos,
    )


def frame_counts(engine: sa.Engine, project_id: int, videos: VideoTotals) -> dict[str, int]:
    """Frames the project's filter looked at and kept (from its `videos`), and what dedup and
    the dataset kept."""
    with engine.connect() as c:
        outcomes = dict(
            c.execute(
                sa.text(f"""SELECT stage, outcome FROM {S}.work_items WHERE project_id = :p
                               AND stage IN ('dedup', 'dataset') AND status = 'done'"""),
                {"p": project_id},
            ).all()
        )
    return {
        "extracted": sum(s.extracted for s in videos.sources),
        "passed_filter": sum(s.passed for s in videos.sources),
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
    videos = summary.videos  # read once for its work, yield, frames and budget
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
        for held in catalog.store.liveness.long_running(long_running, project.id)
    ]
    copies = [
        {
            "video": r.video_id,
            "source": redact_url(r.url) if r.url else r.source_path,
            "same_as": r.same_as,
            "original_source": redact_url(r.original_url) if r.original_url else r.original_path,
        }
        for r in catalog.videos.project_copies(project.id)
    ]
    frames = frame_counts(engine, project.id, videos)
    return {
        "project": project.name,
        "stage": project.stage,
        "error": project.error,
        "output_dir": str(project.output_dir),
        "videos": videos.videos,
        "refresh": refresh_report(engine, project),
        "target": target_report(
            engine,
            project.id,
            project.config.target.model_dump() if project.config.target else None,
            frames["in_dataset"],
            spent_of(videos),
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
        "yield": yield_per_source(videos),
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
    counts = catalog.projects.member_counts()
    result = []
    for p in catalog.projects.all():
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


def source_yield(engine: sa.Engine, project_id: int) -> list[dict]:
    """`yield_per_source` of the project, read now."""
    with engine.connect() as c:
        return yield_per_source(video_totals(c, project_id, ()))


def yield_per_source(videos: VideoTotals) -> list[dict]:
    """Per source of the project's `videos` (a search, a listing, a URL file, the config's URLs,
    a files pattern, add-video): videos linked and downloaded, minutes downloaded, frames
    extracted, passed by the filter and kept by dedup, and kept frames per downloaded video and
    per downloaded minute; the best yield per video first. A video found by two sources counts
    for the first."""
    found = []
    for s in videos.found:
        minutes = s.downloaded_s / 60.0
        found.append(
            {
                "source": redact(s.name),
                "videos": s.videos,
                "downloaded": s.downloaded,
                "downloaded_minutes": round(minutes, 2),
                "frames_extracted": s.extracted,
                "frames_passed": s.passed,
                "frames_kept": s.kept,
                "kept_per_video": round(s.kept / s.downloaded, 2) if s.downloaded else None,
                "kept_per_minute": round(s.kept / minutes, 2) if minutes else None,
            }
        )
    # Downloads are what acquisition spends (assets/catalog/source_choice.py): the best kept per video first.
    return sorted(found, key=lambda y: (-(y["kept_per_video"] or 0), y["source"]))
