"""A Dagster schedule per project that follows its sources (`inputs.refresh`).

`refresh_project_<name>` has the project's cron and time zone and runs by default; the UI's
Automation page lists it with its next tick and its history, and turns it off and on like any
schedule (the instance keeps that choice across reloads). At its tick it queues the project's
catalog to list the sources again (db/source_refresh.py) and requests the catalog run, within the
catalog lane's share of runs (past it, the work sensor requests the run when one ends); a listing
queued, running or waiting to retry takes the tick instead.

A schedule is a definition and a project is a row, so the schedules are read from the database
when a code server loads the definitions (Dagster's INITIALIZATION; a run worker, which
reconstructs them, reads nothing; no database is started for it). A project added, or whose
refresh changed, since that load gets its schedule at the next one: a standalone `dagster-daemon`
(`dataminer services`) reloads its code servers every minute; under `dg dev`, and for the UI's
view, "Reload definitions" does. Until then the refresh_sources sensor keeps the project's cron
as it is in the database (sensors/pipeline_sensors.py), and a loaded schedule whose cron is no
longer the project's skips its ticks, so that a refresh is neither missed nor doubled. A
schedule turned off stays off for the sensor too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.assets.catalog.config import RefreshConfig
from dataminer_dagster.db.project_records import ProjectRow, followed_sources
from dataminer_dagster.db.server import running_claims_database_url
from dataminer_dagster.engine.jobs import lanes_of, name_prefix
from dataminer_dagster.lanes import Lane
from dataminer_dagster.registry import CATALOG
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.settings import Settings

if TYPE_CHECKING:  # the schedules must not import the stage modules (and their libraries)
    from dataminer_dagster.engine.stage_asset import StageAsset

_log = logging.getLogger(__name__)
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_]")
CONNECT_TIMEOUT_S = 5


def schedule_name(prefix: str, project: str) -> str:
    """`refresh_project_<project>`, with the characters a Dagster name cannot hold (`-`) made
    `_` (a name no sensor or job of the pipeline has, whatever the project is called)."""
    return f"{prefix}refresh_project_{_NOT_IN_A_NAME.sub('_', project)}"


def followed_projects(settings: Settings) -> dict[str, RefreshConfig]:
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
    return _read_followed_projects(settings)


def _read_followed_projects(settings: Settings) -> dict[str, RefreshConfig]:
    """name -> refresh of every project with `inputs.refresh`, read from the claim tables if
    their server runs (loading definitions starts no database: `dg check defs` does not need
    one)."""
    try:
        url = running_claims_database_url(settings)
        if url is None:
            return {}
        # Read only, and soon given up: a load neither upgrades the schema nor waits on a
        # server that does not answer.
        engine = sa.create_engine(
            url,
            poolclass=sa.pool.NullPool,
            connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
        )
        try:
            return followed_sources(engine)
        finally:
            engine.dispose()
    except sa.exc.ProgrammingError:  # a new database: no projects table yet, no project
        return {}
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
    """One schedule per followed project (`followed` in the order the projects were
    registered), for the pipeline of these stages, lanes and jobs (none without its catalog
    lane). Of two project names that give one schedule name (`a-b`, `a_b`), the one registered
    first has it, and the sensor keeps the other's cron."""
    (catalog_lane,) = [lane for lane in lanes_of(stages, lanes) if CATALOG in lane.stages] or [None]
    if catalog_lane is None:
        return []
    prefix = name_prefix(stages.values())
    stage_keys = {stage: s.key for stage, s in stages.items()}
    schedules: dict[str, dg.ScheduleDefinition] = {}
    for project, refresh in followed.items():
        name = schedule_name(prefix, project)
        if name not in schedules:
            schedules[name] = _refresh_schedule(
                name, project, refresh, jobs[catalog_lane.name], catalog_lane, stage_keys
            )
    return list(schedules.values())


def scheduled_projects(
    schedules: Sequence[dg.ScheduleDefinition], followed: Mapping[str, RefreshConfig]
) -> dict[str, RefreshConfig]:
    """project -> the refresh its schedule was built with, for the projects these schedules
    refresh (their tag)."""
    return {s.tags[_PROJECT_TAG]: followed[s.tags[_PROJECT_TAG]] for s in schedules}


def left_to_sensor(
    projects: Sequence[ProjectRow],
    scheduled: Mapping[str, RefreshConfig],
    stopped: frozenset[str],
    prefix: str,
) -> list[ProjectRow]:
    """The followed projects whose crons the refresh_sources sensor keeps: those without a
    schedule of this load, or whose schedule has another cron than the project has now, unless
    a person turned the project's schedule off (`stopped`: the names of stopped schedules)."""
    return [
        p
        for p in projects
        if p.config.inputs.refresh is not None
        and scheduled.get(p.name) != p.config.inputs.refresh
        and schedule_name(prefix, p.name) not in stopped
    ]


def stopped_schedules(instance: dg.DagsterInstance) -> frozenset[str]:
    """The names of the schedules turned off in this instance (the UI's switch)."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

    states = instance.all_instigator_state(
        instigator_type=InstigatorType.SCHEDULE, instigator_statuses={InstigatorStatus.STOPPED}
    )
    return frozenset(state.instigator_name for state in states)


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

        row = db.catalog.projects.get(project)
        if row is None or row.config.inputs.refresh is None:
            return dg.SkipReason(
                f"{project} no longer follows its sources: this schedule goes at the code "
                "location's next load"
            )
        if row.config.inputs.refresh != refresh:
            now = row.config.inputs.refresh
            return dg.SkipReason(
                f"{project}'s refresh is now '{now.cron}' ({now.timezone}): the refresh_sources "
                "sensor keeps it until the code location loads this schedule again"
            )
        # Within the lane's share of runs, as the work sensor keeps it; past it, the work
        # sensor requests the catalog run when a run ends.
        full = _live_runs(context.instance, catalog_lane) >= catalog_lane.policy.max_runs
        request = source_refresh.request_refresh(db.store, row.id, project, scheduled=not full)
        context.log.info(f"refresh of {project}: {request.reason}")
        if not request.queued or request.catalog_item is None:
            return dg.SkipReason(f"{project}: {request.reason}")
        if full:
            return dg.SkipReason(
                f"{project}: {request.reason}; the catalog lane runs "
                f"{catalog_lane.policy.max_runs} runs already: the work sensor requests its run"
            )
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


def _live_runs(instance: dg.DagsterInstance, lane: Lane) -> int:
    """The lane's runs not finished (queued, starting, started, cancelling)."""
    from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

    from dataminer_dagster.tags import LANE_TAG

    return instance.get_runs_count(
        dg.RunsFilter(tags={LANE_TAG: lane.name}, statuses=list(NOT_FINISHED_STATUSES))
    )
