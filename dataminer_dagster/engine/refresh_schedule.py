"""When a project's sources are listed again: its `inputs.refresh` cron, from its last listing.

A project is due when a tick of its cron (in its time zone) has passed since its catalog last
finished, and no listing of it is queued or running. The refresh_sources sensor asks for those
whose own schedule is not loaded with that cron (sensors/refresh_schedules.py; db/
source_refresh.py); a missed tick (the daemon was down) is caught up once, not once per tick.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import DEAD, DONE


def refresh_due(cron: str, timezone: str, last_listed: datetime, now: datetime) -> bool:
    """A tick of `cron` lies after `last_listed` and at or before `now`."""
    from dagster._utils.schedules import get_latest_completed_cron_tick

    return get_latest_completed_cron_tick(cron, now, timezone) > last_listed


def next_refresh(cron: str, timezone: str, last_listed: datetime | None) -> datetime | None:
    """When a project listed at `last_listed` is listed again: the first tick of `cron` after it
    (None before its first listing, which the project's catalog does anyway)."""
    from dagster._utils.schedules import get_next_cron_tick

    return None if last_listed is None else get_next_cron_tick(cron, last_listed, timezone)


def due_projects(
    projects: Iterable[ProjectRow],
    listings: Mapping[str, tuple[int, str, datetime | None]],
    now: datetime,
) -> list[ProjectRow]:
    """The projects with a refresh schedule that is due (`listings`: source_refresh.last_listings)."""
    due = []
    for project in projects:
        schedule = project.config.inputs.refresh
        _, status, finished_at = listings.get(project.name, (None, None, None))
        if schedule is None or status not in (DONE, DEAD) or finished_at is None:
            continue
        if refresh_due(schedule.cron, schedule.timezone, finished_at, now):
            due.append(project)
    return due
