"""The sensors that replace the monitor worker.

* work: one monitor cycle per tick (engine/discovery.py, engine/planning.py): new catalog rows
  become dynamic partitions (<= 25,000 per tick, cursor-chunked) and deleted rows' partitions go;
  projects move through dedup -> detect -> dataset -> complete, or reopen; batched runs are
  requested per lane for ready work, and ahead for work that runs in flight are producing
* lease_reaper: runs that died (no heartbeat, or never started) are failed in Dagster with the
  reason; leases of dead or finished runs come back, counted as attempts; leases held far longer
  than their stage usually takes are reported
* release_failed_runs / release_cancelled_runs: a run's leases are released at once
* refresh_sources: projects whose `inputs.refresh` cron is due and whose own schedule is not
  loaded with that cron yet (sensors/refresh_schedules.py: at the code location's next load) have
  their sources listed again (their catalog is queued; the work sensor requests its run)

All run by default. They read and write the claim tables only; no network I/O happens here.
While the database is unreachable, restarting or out of disk, a tick does nothing and says so in
one line (`_while_the_database_is_up`); the next tick tries again, and the reaper's first pass
after it records the outage, so that no run is judged by silence from the time it lasted.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from dataminer_dagster.db.outages import not_waiting_for_the_database, outage_reason
from dataminer_dagster.db.scheduling import clear_requested
from dataminer_dagster.engine.discovery import DiscoveryCursor
from dataminer_dagster.engine.jobs import lanes_of, name_prefix
from dataminer_dagster.engine.planning import (
    RunLimits,
    acquisition_observation,
    batch_range,
    plan_cycle,
    record_requests,
)
from dataminer_dagster.engine.run_health import reap_dead_work
from dataminer_dagster.lanes import Lane
from dataminer_dagster.registry import DATASET
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.settings import EXECUTORS, Settings, executor_name
from dataminer_dagster.tags import STAGES_TAG

if TYPE_CHECKING:  # the sensors must not import the stage modules (and their libraries)
    from dataminer_dagster.assets.catalog.config import RefreshConfig
    from dataminer_dagster.engine.stage_asset import StageAsset

RUNNING = dg.DefaultSensorStatus.RUNNING


def _while_the_database_is_up(sensor: Callable) -> Callable:
    """A sensor whose tick, when the database is unreachable, restarting or out of disk, skips
    at once with one line that says since when and why (no traceback); the next tick tries
    again."""

    @functools.wraps(sensor)
    def tick(context, db: DatabaseResource):
        try:
            with not_waiting_for_the_database():
                result = sensor(context, db)
        except Exception as error:
            reason = outage_reason(error)
            if reason is None:
                raise
            since = ""
            if db.outages is not None:  # the reaper's next pass records it
                since = f" since {db.outages.unreachable(reason).wall:%H:%M:%S}"
            return dg.SkipReason(
                f"database unreachable{since}, retrying at the next tick: {reason}"
            )
        if db.outages is not None:
            db.outages.reachable()
        return result

    return tick


# What the UI shows for each sensor.
_WORK_DESCRIPTION = (
    "The monitor's cycle: adds a dynamic partition for every new project, video and project "
    "video (and removes those of deleted rows), moves projects to dedup, detect, dataset "
    "and complete, and requests batched runs for ready work, lane by lane, plus runs that "
    "start ahead of work still in flight."
)
_LEASE_REAPER_DESCRIPTION = (
    "Fails in Dagster the runs that died (no heartbeat; started or queued far too long), "
    "takes back the leases of runs that stopped heartbeating or finished, and warns once "
    "about each lease held far longer than its stage usually takes."
)
_REFRESH_SOURCES_DESCRIPTION = (
    "Lists the sources of a project with an `inputs.refresh` cron again when it is due, while "
    "the project's own refresh_project_<name> schedule is not loaded with that cron (until the "
    "code location loads again): its catalog is queued, links only the videos the project has "
    "not seen, and a finished project reopens to take them. A schedule turned off stays off."
)
_RELEASE_FAILED_RUNS_DESCRIPTION = (
    "A failed run's leases are released at once (the attempt counts), and the items it was "
    "requested for can be requested again."
)
_RELEASE_CANCELLED_RUNS_DESCRIPTION = (
    "A cancelled run's leases are released at once (the attempt does not count), and the "
    "items it was requested for can be requested again."
)


def build_sensors(
    stages: Mapping[str, StageAsset],
    jobs: Mapping[str, dg.UnresolvedAssetJobDefinition],
    lanes: Sequence[Lane],
    settings: Settings,
    *,
    ahead: bool | None = None,
    scheduled: Mapping[str, RefreshConfig] | None = None,
) -> list[dg.SensorDefinition]:
    """The pipeline's sensors for these stages (work-item stage -> declared asset), lanes and
    their jobs; their names start with the stages' key prefix. `ahead`: request runs ahead of
    their input (default: when $DATAMINER_EXECUTOR is the in-process executor). `scheduled`:
    the projects whose refreshes their own schedules request, with the refresh each schedule
    has (sensors/refresh_schedules.py), which refresh_sources leaves to them."""
    scheduled = scheduled or {}
    partitions = {s.partitions_def.name: s.partitions_def for s in stages.values()}
    lanes = lanes_of(stages, lanes)
    job_names = {name: job.name for name, job in jobs.items()}
    stage_keys = {stage: s.key for stage, s in stages.items()}
    config_keys = {stage: s.config_key for stage, s in stages.items() if s.config_key}
    # A run requested ahead waits for its input in its database resource's set-up: before any
    # step and its `gpu` slot only where the run worker sets resources up, in process. Under the
    # other executors the step's process does, holding the slot that the work it waits for needs.
    if ahead is None:
        ahead = executor_name() == EXECUTORS[0]
    prefix = name_prefix(stages.values())

    @dg.sensor(
        name=f"{prefix}work",
        minimum_interval_seconds=settings.sensors.work_interval_s,
        default_status=RUNNING,
        jobs=list(jobs.values()),
        description=_WORK_DESCRIPTION,
    )
    @_while_the_database_is_up
    def work(context: dg.SensorEvaluationContext, db: DatabaseResource):
        cycle = plan_cycle(
            context.instance,
            db.store,
            lanes,
            DiscoveryCursor.parse(context.cursor),
            jobs=job_names,
            stage_keys=stage_keys,
            config_keys=config_keys,
            limits=RunLimits(db.settings.lease, db.settings.runs),
            ahead=ahead,
        )
        if not (
            cycle.discovery.count
            or cycle.discovery.removals
            or cycle.transitions
            or cycle.acquisitions
            or cycle.config_versions
            or cycle.runs
        ):
            context.update_cursor(cycle.discovery.cursor.dump())  # when it last compared keys
            return dg.SkipReason("nothing new, no project can move, no work to request")
        record_requests(db.store.engine, cycle.runs)
        context.log.info(cycle.summary())
        return dg.SensorResult(
            asset_events=[
                acquisition_observation(stage_keys[DATASET], project, decision)
                for project, decision in cycle.acquisitions
                if DATASET in stage_keys
            ]
            + cycle.config_versions,
            run_requests=[p.request for p in cycle.runs],
            dynamic_partitions_requests=cycle.discovery.removal_requests(partitions),
            cursor=cycle.discovery.cursor.dump(),
        )

    @dg.sensor(
        name=f"{prefix}lease_reaper",
        minimum_interval_seconds=settings.sensors.reaper_interval_s,
        default_status=RUNNING,
        description=_LEASE_REAPER_DESCRIPTION,
    )
    @_while_the_database_is_up
    def lease_reaper(context: dg.SensorEvaluationContext, db: DatabaseResource):
        store, limits = db.store, db.settings
        reaper = reap_dead_work(context.instance, store, lease=limits.lease, runs=limits.runs)
        for line in reaper.lines():
            context.log.warning(line)
        dead, reaped = reaper.dead, reaper.reaped

        warned = set(json.loads(context.cursor)) if context.cursor else set()
        long_running = store.liveness.long_running(limits.long_running)
        for held in long_running:
            if str(held.token) not in warned:
                context.log.warning(held.describe())
        context.update_cursor(json.dumps(sorted(str(h.token) for h in long_running)))

        done = []
        if dead:
            done.append(f"ended {len(dead)} dead runs")
        if reaped:
            done.append(f"reaped {len(reaped)} leases")
        if long_running:
            done.append(f"{len(long_running)} long-running leases")
        return dg.SkipReason("; ".join(done) or "every lease belongs to a live run")

    @dg.sensor(
        name=f"{prefix}refresh_sources",
        minimum_interval_seconds=settings.sensors.refresh_interval_s,
        default_status=RUNNING,
        description=_REFRESH_SOURCES_DESCRIPTION,
    )
    @_while_the_database_is_up
    def refresh_sources(context: dg.SensorEvaluationContext, db: DatabaseResource):
        from datetime import UTC, datetime

        from dataminer_dagster.db import source_refresh
        from dataminer_dagster.engine.refresh_schedule import due_projects
        from dataminer_dagster.sensors.refresh_schedules import left_to_sensor, stopped_schedules

        listings = source_refresh.last_listings(db.store.engine)
        queued = []
        unscheduled = left_to_sensor(
            db.catalog.projects.all(), scheduled, stopped_schedules(context.instance), prefix
        )
        for project in due_projects(unscheduled, listings, datetime.now(UTC)):
            request = source_refresh.request_refresh(db.store, project.id, project.name)
            context.log.info(f"refresh of {project.name}: {request.reason}")
            queued += [project.name] if request.queued else []
        if not queued:
            return dg.SkipReason("no project's refresh is due")
        return dg.SkipReason(f"refresh queued: {', '.join(queued)} (the work sensor runs it)")

    @dg.run_failure_sensor(
        name=f"{prefix}release_failed_runs",
        default_status=RUNNING,
        monitor_all_code_locations=True,
        description=_RELEASE_FAILED_RUNS_DESCRIPTION,
    )
    @_while_the_database_is_up
    def release_failed_runs(context: dg.RunFailureSensorContext, db: DatabaseResource):
        _release(context, db, "failed", count_attempt=True)

    @dg.run_status_sensor(
        name=f"{prefix}release_cancelled_runs",
        run_status=dg.DagsterRunStatus.CANCELED,
        default_status=RUNNING,
        monitor_all_code_locations=True,
        description=_RELEASE_CANCELLED_RUNS_DESCRIPTION,
    )
    @_while_the_database_is_up
    def release_cancelled_runs(context: dg.RunStatusSensorContext, db: DatabaseResource):
        _release(context, db, "was cancelled", count_attempt=False)

    return [work, lease_reaper, refresh_sources, release_failed_runs, release_cancelled_runs]


def _release(context, db: DatabaseResource, what: str, *, count_attempt: bool) -> None:
    run = context.dagster_run
    released = db.store.liveness.release_run(
        run.run_id, f"run {run.run_id} {what}", count_attempt=count_attempt
    )
    stages, batch = run.tags.get(STAGES_TAG), batch_range(run.tags)
    cleared = clear_requested(db.store.engine, stages.split(","), *batch) if stages and batch else 0
    if released or cleared:
        context.log.info(
            f"run {run.run_id} {what}: released {released} leases, {cleared} items can be requested again"
        )
