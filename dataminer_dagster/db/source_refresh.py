"""Listing a project's sources again: refresh requests, what each search and listing found, and
the back-off of a source that fails.

A refresh (`dataminer refresh`, the project's `refresh_project_<name>` schedule at a tick of
its `inputs.refresh` cron, or the refresh_sources sensor for a project without that schedule
yet) sets `projects.refresh_requested_at` and queues the project's catalog. That catalog run
lists every source again and links only the videos the project has not seen, rejected and dead
ones included; with nothing new it queues nothing, so a refresh that finds nothing makes no
download and no model call. A project whose catalog has not finished a first listing needs no
refresh (the listing under way takes the newest entries), and neither does one whose listing
runs now: the request is merged into it.

A search or listing that fails is recorded with its error and asked again only after a back-off
that doubles with each failure in a row (FIRST_BACKOFF_S up to MAX_BACKOFF_S); the other sources
are listed meanwhile, and `dataminer status` shows the failing ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DEAD, DONE, FAILED, PENDING, RUNNING, SCHEMA
from dataminer_dagster.registry import CATALOG

S = SCHEMA
FIRST_BACKOFF_S = 15 * 60
MAX_BACKOFF_S = 24 * 3600


@dataclass(frozen=True)
class RefreshRequest:
    project: str
    queued: bool  # False: merged into a listing that is pending or runs now
    reason: str
    catalog_item: int | None = None  # the work item queued, when queued


@dataclass(frozen=True)
class SourceState:
    source: str  # "search: <query>", "listing: <url>"
    listed_at: datetime | None
    videos_listed: int
    videos_new: int
    failures: int
    last_error: str | None
    retry_at: datetime | None


def request_refresh(
    store: LeaseStore, project_id: int, name: str, *, scheduled: bool = False
) -> RefreshRequest:
    """Ask for the project's sources to be listed again (see the module's docstring).
    `scheduled`: asked by the project's schedule, which requests the catalog run itself (not the
    work sensor), and for which a listing that failed and waits for its retry is under way (a
    person's request lists it now, with fresh attempts)."""
    with store.engine.begin() as conn:
        catalog, item = conn.execute(
            sa.text(f"""SELECT status, id FROM {S}.work_items
                         WHERE stage = '{CATALOG}' AND item_key = :name FOR UPDATE"""),
            {"name": name},
        ).one_or_none() or (None, None)
        if catalog not in ((DONE, DEAD) if scheduled else (DONE, FAILED, DEAD)):
            what = {RUNNING: "runs now", FAILED: "waits for its retry"}.get(catalog, "is queued")
            return RefreshRequest(name, False, f"its listing {what}: it takes the newest entries")
        conn.execute(
            sa.text(f"UPDATE {S}.projects SET refresh_requested_at = now() WHERE id = :id"),
            {"id": project_id},
        )
        store.enqueue(
            CATALOG,
            [name],
            project_ids=[project_id],
            reset=(DONE, FAILED, DEAD),
            conn=conn,
            requested=scheduled,
        )
    return RefreshRequest(name, True, "its catalog is queued to list the sources again", item)


def refresh_requested(conn: sa.Connection, project_id: int) -> bool:
    return bool(
        conn.execute(
            sa.text(f"SELECT refresh_requested_at IS NOT NULL FROM {S}.projects WHERE id = :id"),
            {"id": project_id},
        ).scalar()
    )


def unseen(conn: sa.Connection, project_id: int, video_ids: Iterable[str]) -> set[str]:
    """The videos among `video_ids` that the project has not linked (in any state)."""
    ids = list(video_ids)
    seen = conn.execute(
        sa.text(f"""SELECT video_id FROM {S}.project_videos
                     WHERE project_id = :p AND video_id = ANY(CAST(:ids AS text[]))"""),
        {"p": project_id, "ids": ids},
    ).scalars()
    return set(ids) - set(seen)


def waiting_sources(conn: sa.Connection, project_id: int) -> frozenset[str]:
    """The project's sources that failed and wait for their back-off: not asked this time."""
    return frozenset(
        conn.execute(
            sa.text(f"""SELECT source FROM {S}.project_sources
                         WHERE project_id = :p AND retry_at > now()"""),
            {"p": project_id},
        ).scalars()
    )


def record_listing(
    conn: sa.Connection,
    project_id: int,
    listed: Mapping[str, int],
    new: Mapping[str, int],
    failed: Mapping[str, str],
) -> None:
    """What this catalog run's searches and listings found (`listed`, `new` to the project per
    source) or why they failed (`failed`), and that the refresh asked for is done."""
    if listed:
        conn.execute(
            sa.text(f"""
                INSERT INTO {S}.project_sources AS s (project_id, source, listed_at, videos_listed, videos_new)
                SELECT :p, source, now(), n, m
                  FROM unnest(CAST(:sources AS text[]), CAST(:listed AS int[]), CAST(:new AS int[]))
                       AS t(source, n, m)
                ON CONFLICT (project_id, source) DO UPDATE
                   SET listed_at = now(), videos_listed = EXCLUDED.videos_listed,
                       videos_new = EXCLUDED.videos_new, failures = 0, last_error = NULL,
                       retry_at = NULL, updated_at = now()
            """),
            {
                "p": project_id,
                "sources": list(listed),
                "listed": list(listed.values()),
                "new": [new.get(source, 0) for source in listed],
            },
        )
    if failed:
        conn.execute(
            sa.text(f"""
                INSERT INTO {S}.project_sources AS s (project_id, source, failures, last_error, retry_at)
                SELECT :p, source, 1, error, now() + make_interval(secs => :first)
                  FROM unnest(CAST(:sources AS text[]), CAST(:errors AS text[])) AS t(source, error)
                ON CONFLICT (project_id, source) DO UPDATE
                   SET failures = s.failures + 1, last_error = EXCLUDED.last_error,
                       retry_at = now() + make_interval(secs => least(
                           :first * power(2, s.failures), :most)),
                       updated_at = now()
            """),
            {
                "p": project_id,
                "sources": list(failed),
                "errors": [redact(e) for e in failed.values()],
                "first": FIRST_BACKOFF_S,
                "most": MAX_BACKOFF_S,
            },
        )
    conn.execute(
        sa.text(f"UPDATE {S}.projects SET refresh_requested_at = NULL WHERE id = :id"),
        {"id": project_id},
    )


def source_states(engine: sa.Engine, project_id: int) -> list[SourceState]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"""SELECT source, listed_at, videos_listed, videos_new, failures,
                               last_error, retry_at
                          FROM {S}.project_sources WHERE project_id = :p ORDER BY source"""),
            {"p": project_id},
        ).all()
    return [SourceState(*row) for row in rows]


def last_listings(engine: sa.Engine) -> dict[str, tuple[int, str, datetime | None]]:
    """{project name: (id, its catalog item's status, when it last finished)} for every project
    with a catalog item: what the refresh schedule starts from."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"""SELECT p.name, p.id, w.status, w.finished_at
                          FROM {S}.projects p
                          JOIN {S}.work_items w ON w.stage = '{CATALOG}' AND w.item_key = p.name""")
        ).all()
    return {r.name: (r.id, r.status, r.finished_at) for r in rows}


def listings_under_way(engine: sa.Engine, names: Iterable[str]) -> set[str]:
    """The projects among `names` whose catalog is queued, runs or waits for a retry: a finished
    project with one is being refreshed, and is not finished until the listing is."""
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text(f"""SELECT item_key FROM {S}.work_items
                             WHERE stage = '{CATALOG}' AND item_key = ANY(CAST(:names AS text[]))
                               AND status IN ('{PENDING}', '{RUNNING}', '{FAILED}')"""),
                {"names": list(names)},
            ).scalars()
        )
