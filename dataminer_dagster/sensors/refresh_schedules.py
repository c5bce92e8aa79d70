"""A Dagster schedule per project that follows its sources (`inputs.refresh`).

`refresh_<project>` has the project's cron and time zone and runs by default; the UI's Automation
page lists it with its next tick and its history, and turns it off and on like any schedule (the
instance keeps that choice across reloads). At its tick it queues the project's catalog to list
the sources again (db/source_refresh.py) and requests the catalog run; when a listing is queued
or runs already, the tick is merged into it and requests nothing.

A schedule is a definition and a project is a row, so the schedules are read from the database
when a code server loads the definitions (Dagster's INITIALIZATION; a run worker, which
reconstructs them, reads nothing). A project added or given a refresh later has its schedule from
the code location's next load: `dagster-daemon` reloads its code servers every minute, the UI on
"Reload definitions". Until then, and where the database could not be read at load, the
refresh_sources sensor keeps the project's cron (sensors/pipeline_sensors.py), so that no refresh is
missed while a schedule is not there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from dataminer_dagster.assets.catalog.config import RefreshConfig
from dataminer_dagster.db.project_records import followed_sources
from dataminer_dagster.db.server import running_claims_database_url
from dataminer_dagster.engine.jobs import lanes_of, name_prefix
from dataminer_dagster.engine.lanes import Lane
from dataminer_dagster.engine.registry import CATALOG
from dataminer_dagster.resources.db import DatabaseResource, claims_store
from dataminer_dagster.settings import Settings

if TYPE_CHECKING:  # the schedules must not import the stage modules (and their libraries)
    from dataminer_dagster.engine.stage import StageAsset

_log = logging.getLogger(__name__)
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_]")


def schedule_name(prefix: str, project: str) -> str:
    """`refresh_<project>`, with the characters a Dagster name cannot hold (`-`) made `_`."""
    return f"{prefix}refresh_{_NOT_IN_A_NAME.sub('_', project)}"


def followed_projects(
    settings: Settings, database_url: str | None = None
) -> dict[str, RefreshConfig]:
    """name -> refresh of every project with `inputs.refresh`, read now when a Dagster loader
    initialises the code location; nothing when it reconstructs it (a run worker), when no
    loader loads it (a test or a script importing the module) or when the embedded database
    does not run yet. A database that cannot be read gives no schedules and a warning. Either
    way the refresh_sources sensor keeps the crons until a later load reads them."""
    from dagster._core.definitions.definitions_load_context import (
        DefinitionsLoadContext,
        DefinitionsLoadType,
    )

    if not DefinitionsLoadContext.is_set():
        return {}
    if DefinitionsLoadContext.get().load_type is not DefinitionsLoadType.INITIALIZATION:
        return {}
    return read_followed_projects(settings, database_url)


def read_followed_projects(
    settings: Settings, database_url: str | None = None
) -> dict[str, RefreshConfig]:
    """name -> refresh of every project with `inputs.refresh`, read from the claim tables if
    their server runs (loading definitions starts no database: `dg check defs` does not need
    one)."""
    try:
        url = database_url or running_claims_database_url(settings)
        if url is None:
            return {}
        return followed_sources(claims_store(settings, url).engine)
    except Exception as error:  # a code location loads without them rather than not at all
        _log.warning(
            "the projects' refresh schedules could not be read (%s); the refresh_sources sensor "
            "keeps their crons until the code location loads them",
            error,
        )
        return {}


def refresh_schedules(
    stages: Mapping[str, StageAsset],
    jobs: Mapping[str, dg.UnresolvedAssetJobDefinition],
    lanes: Sequence[Lane],
    followed: Mapping[str, RefreshConfig],
) -> list[dg.ScheduleDefinition]:
    """One schedule per followed project, for the pipeline of these stages, lanes and jobs (none
    without its catalog lane). Of two project names that give one schedule name (`a-b`, `a_b`),
    the first in name order has it, and the sensor keeps the other's cron."""
    (catalog_lane,) = [lane for lane in lanes_of(stages, lanes) if CATALOG in lane.stages] or [None]
    if catalog_lane is None:
        return []
    prefix = name_prefix(stages.values())
    stage_keys = {stage: s.key for stage, s in stages.items()}
    schedules: dict[str, dg.ScheduleDefinition] = {}
    for project, refresh in sorted(followed.items()):
        name = schedule_name(prefix, project)
        if name not in schedules:
            schedules[name] = _refresh_schedule(
                name, project, refresh, jobs[catalog_lane.name], catalog_lane, stage_keys
            )
    return list(schedules.values())


def scheduled_projects(schedules: Sequence[dg.ScheduleDefinition]) -> frozenset[str]:
    """The projects these schedules refresh (their tag), which the sensor leaves to them."""
    return frozenset(s.tags[_PROJECT_TAG] for s in schedules)


_PROJECT_TAG = "dataminer/refresh_of"


def _refresh_schedule(
    name: str,
    project: str,
    refresh: RefreshConfig,
    catalog_job: dg.UnresolvedAssetJobDefinition,
    catalog_lane: Lane,
    stage_keys: Mapping[str, dg.AssetKey],
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=name,
        cron_schedule=refresh.cron,
        execution_timezone=refresh.timezone,
        job=catalog_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        tags={_PROJECT_TAG: project},
        description=(
            f"Lists the sources of project {project} again ({refresh.cron}, {refresh.timezone}; "
            "its `inputs.refresh`): its catalog links only the videos it has not seen, and a "
            "finished project reopens to take them. Turn it off here to pause this project's "
            "refreshes; `dataminer refresh` still lists on demand."
        ),
    )
    def refresh_project(context: dg.ScheduleEvaluationContext, db: DatabaseResource):
        from dataminer_dagster.db import source_refresh
        from dataminer_dagster.engine.planning import lane_run

        row = db.catalog.project(project)
        if row is None or row.config.inputs.refresh is None:
            return dg.SkipReason(
                f"{project} no longer follows its sources: this schedule goes at the code "
                "location's next load"
            )
        request = source_refresh.request_refresh(db.store, row.id, project, requested=True)
        context.log.info(f"refresh of {project}: {request.reason}")
        if not request.queued or request.catalog_item is None:
            return dg.SkipReason(f"{project}: {request.reason}")
        planned = lane_run(
            catalog_lane,
            catalog_lane.stages,
            [project],
            [request.catalog_item],
            {catalog_lane.name: catalog_job.name},
            stage_keys,
            project_names=project,
            requested_by="schedule",
        )
        return planned.request

    return refresh_project
