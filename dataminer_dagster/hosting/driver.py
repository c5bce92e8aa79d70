"""`dataminer run`: drive projects to completion in one foreground process, for machines without
the Dagster UI. It takes exactly the sensors' decisions (discovery, work, transitions, reaper) and
executes the requested runs in this process, through Dagster, so they are recorded like any other
run. Models stay loaded between runs, so each is loaded once per command. Dagster's console lines
say a failure the stages described on one line, without a stack, and go to the terminal directly,
not through the run's captured standard error (described_failures.py).

A database that goes away (a restart, a failover, a network cut, a full disk) is waited for, up
to `leases.outage_wait_s` (db/outages.py): the command and its runs say so in one line a minute and
go on where they were once it is back; a run that failed meanwhile gives its items back
uncounted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import dagster as dg

from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.outages import outages_of, wait_out, waiting_for_the_database
from dataminer_dagster.db.project_flow import COMPLETE, PROJECT_FAILED
from dataminer_dagster.db.project_records import project_columns
from dataminer_dagster.db.scheduling import next_due
from dataminer_dagster.db.source_refresh import listings_under_way
from dataminer_dagster.engine.discovery import DiscoveryCursor
from dataminer_dagster.engine.jobs import lane_jobs, lanes_of
from dataminer_dagster.engine.planning import (
    RunLimits,
    acquisition_observation,
    plan_cycle,
    record_requests,
)
from dataminer_dagster.engine.run_health import reap_dead_work
from dataminer_dagster.hosting.described_failures import (
    console_on_the_terminal,
    one_line_console_logger,
)
from dataminer_dagster.lanes import DEFAULT_LANES, Lane
from dataminer_dagster.registry import DATASET
from dataminer_dagster.tags import DEADLINE_TAG

if TYPE_CHECKING:
    from dataminer_dagster.engine.stage_asset import StageAsset

T = TypeVar("T")

# The event log of an instance whose runs are not kept (`dataminer run` without DAGSTER_HOME, the
# tests' instances): in memory, for as long as the instance lives. Dagster's default keeps a SQLite
# database per run and stamps its schema as each run starts, a large share of a short run. It
# keeps no concurrency pools (the `gpu` slot), which a private instance that executes one run at
# a time in its own process has no use for.
IN_MEMORY_EVENT_LOG = {
    "event_log_storage": {
        "module": "dagster._core.storage.event_log",
        "class": "InMemoryEventLogStorage",
    }
}


class ProjectsGone(LookupError):
    """Projects being driven were deleted meanwhile (`dataminer project delete`)."""

    def __init__(self, names: Sequence[str]):
        self.names = sorted(names)
        listed = ", ".join(self.names)
        super().__init__(
            f"project {listed} was deleted while this command worked on it"
            if len(self.names) == 1
            else f"projects {listed} were deleted while this command worked on them"
        )


@dataclass(frozen=True)
class DriveResult:
    stages: dict[str, str]  # project -> final stage
    runs: int
    failed_runs: int
    seconds: float


def drive(
    projects: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    store: LeaseStore,
    limits: RunLimits,
    on_tick: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = print,
    idle_poll_s: float = 1.0,
    timeout_s: float | None = None,
    log_level: str = "WARNING",
    stages: Mapping[str, StageAsset] | None = None,
    lanes: Sequence[Lane] = DEFAULT_LANES,
) -> DriveResult:
    """Drive `projects` to complete or failed, working only on their items (other projects'
    work waits for its own command or the sensors). `defs` holds the lane jobs of `stages`
    (default: the pipeline's) and `lanes`. Past `timeout_s` the runs start no new item and
    TimeoutError is raised; ProjectsGone when a project is deleted meanwhile.

    Each cycle first does the lease reaper's work (`limits`): Dagster runs that died (an earlier
    command killed while its run held the `gpu` slot, with DAGSTER_HOME set and no daemon) are
    failed and their slots freed, or this command's GPU steps would wait for those slots for
    ever; stale leases are taken back."""
    with waiting_for_the_database(limits.lease), console_on_the_terminal():
        if stages is None:  # the registry's stages as they are now
            from dataminer_dagster.engine.assembly import stage_assets

            stages = stage_assets()
        lanes = lanes_of(stages, lanes)
        jobs = {name: job.name for name, job in lane_jobs(stages, lanes).items()}
        stage_keys = {stage: s.key for stage, s in stages.items()}
        config_keys = {stage: s.config_key for stage, s in stages.items() if s.config_key}
        engine = store.engine
        outages = outages_of(engine.url)

        def waiting(call: Callable[[], T]) -> T:  # safe to repeat: what the sensors do each tick
            return wait_out(call, outages)

        ids = waiting(lambda: project_columns(store.engine, projects, "id"))
        if unknown := sorted(set(projects) - set(ids)):
            raise ValueError(f"unknown projects: {unknown}")
        project_ids = list(ids.values())
        cursor = DiscoveryCursor()
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        runs = failed = 0
        while True:
            reaper = waiting(
                lambda: reap_dead_work(instance, store, lease=limits.lease, runs=limits.runs)
            )
            for line in reaper.lines():
                log(line)
            # Nothing is in flight between two cycles (every run below ends before the next), so
            # no run is requested ahead of its input.
            cycle = waiting(
                lambda cursor=cursor: plan_cycle(
                    instance,
                    store,
                    lanes,
                    cursor,
                    jobs=jobs,
                    stage_keys=stage_keys,
                    config_keys=config_keys,
                    ahead=False,
                    rerequest_after_s=0,
                    projects=project_ids,
                )
            )
            # The instance's storage is this database too where DAGSTER_HOME names ours
            # (dagster.yaml): a partition removed or an observation reported twice is the same.
            waiting(lambda cycle=cycle: cycle.discovery.remove(instance))
            cursor = cycle.discovery.cursor
            for t in cycle.transitions:
                log(f"project {t.project}: {t.old} -> {t.new} ({t.reason})")
            for observation in cycle.config_versions:
                waiting(lambda o=observation: instance.report_runless_asset_event(o))
            for project, decision in cycle.acquisitions:
                log(f"project {project}: {decision}")
                if DATASET in stage_keys:
                    observation = acquisition_observation(stage_keys[DATASET], project, decision)
                    waiting(lambda o=observation: instance.report_runless_asset_event(o))
            waiting(on_tick)

            stages = waiting(lambda: _stages(store, projects))
            if all(
                stage in (COMPLETE, PROJECT_FAILED) for stage in stages.values()
            ) and not waiting(lambda: listings_under_way(engine, projects)):
                return DriveResult(stages, runs, failed, time.monotonic() - started)
            _check_deadline(deadline, timeout_s, stages)

            if not cycle.runs:
                due = waiting(lambda: next_due(engine))
                time.sleep(idle_poll_s if due is None else min(max(due, 0.05), idle_poll_s * 5))
                continue
            waiting(lambda cycle=cycle: record_requests(engine, cycle.runs))
            for run in cycle.runs:
                _check_deadline(deadline, timeout_s, stages)
                job = defs.resolve_job_def(run.request.job_name).with_logger_defs(
                    {"console": one_line_console_logger}
                )
                tags = dict(run.request.tags)
                if deadline is not None:  # the run stops starting items then, too
                    tags[DEADLINE_TAG] = f"{time.time() + deadline - time.monotonic():.3f}"
                outages_before = outages.begun
                result = job.execute_in_process(
                    instance=instance,
                    tags=tags,
                    asset_selection=run.request.asset_selection,
                    run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
                    raise_on_error=False,
                )
                runs += 1
                if not result.success:
                    failed += 1
                    _release_failed_run(
                        store, result.run_id, outages.begun != outages_before, waiting
                    )
                waiting(on_tick)


def _release_failed_run(
    store: LeaseStore, run_id: str, met_outage: bool, waiting: Callable[[Callable[[], int]], int]
) -> None:
    """Give back what a failed run still held: its begun items count an attempt, unless the
    database went away during the run (an outage is no item's fault)."""
    if met_outage:
        reason = f"run {run_id} failed while the database was unreachable"
    else:
        reason = f"run {run_id} failed"
    waiting(lambda: store.liveness.release_run(run_id, reason, count_attempt=not met_outage))


def _check_deadline(deadline: float | None, timeout_s: float | None, stages: dict) -> None:
    if deadline is not None and time.monotonic() > deadline:
        where = ", ".join(f"project {name} is {stage}" for name, stage in sorted(stages.items()))
        raise TimeoutError(f"not finished after {timeout_s:g} s: {where}")


def _stages(store: LeaseStore, projects: Sequence[str]) -> dict[str, str]:
    stages = project_columns(store.engine, projects, "stage")
    if gone := set(projects) - set(stages):
        raise ProjectsGone(gone)
    return stages
