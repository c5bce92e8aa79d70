"""`dataminer run`: drive projects to completion in one foreground process, for machines without
the Dagster UI. It takes exactly the sensors' decisions (discovery, work, transitions, reaper) and
executes the requested runs in this process, through Dagster, so they are recorded like any other
run. Models stay loaded between runs, so each is loaded once per command.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import dagster as dg

from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_flow import COMPLETE, PROJECT_FAILED, advance_projects
from dataminer_dagster.db.scheduling import next_due
from dataminer_dagster.sensors.planning import (
    DiscoveryCursor,
    plan_discovery,
    plan_work,
    record_requests,
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
    stale_after_s: float,
    on_tick: Callable[[], None] = lambda: None,
    log: Callable[[str], None] = print,
    idle_poll_s: float = 1.0,
    timeout_s: float | None = None,
    log_level: str = "WARNING",
    stage_assets: Mapping[str, dg.AssetsDefinition] | None = None,
) -> DriveResult:
    if stage_assets is None:
        from dataminer_dagster.assets import STAGE_ASSETS as stage_assets
    from dataminer_dagster.sensors.pipeline_sensors import stage_jobs

    engine = store.engine
    jobs = {stage: job.name for stage, job in stage_jobs(stage_assets).items()}
    cursor = DiscoveryCursor()
    started = time.monotonic()
    runs = failed = 0
    while True:
        found = plan_discovery(engine, cursor, instance=instance)
        for name, keys in found.additions.items():
            instance.add_dynamic_partitions(name, keys)
        for name, keys in found.removals.items():
            for key in keys:
                instance.delete_dynamic_partition(name, key)
        cursor = found.cursor
        for reaped in store.reap(stale_after_s):
            log(
                f"{reaped.stage} {reaped.key}: lease of run {reaped.owner} taken back ({reaped.status})"
            )
        for t in advance_projects(store):
            log(f"project {t.project}: {t.old} -> {t.new} ({t.reason})")
        on_tick()

        stages = _stages(store, projects)
        if all(stage in (COMPLETE, PROJECT_FAILED) for stage in stages.values()):
            return DriveResult(stages, runs, failed, time.monotonic() - started)
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise TimeoutError(f"projects not finished after {timeout_s:.0f} s: {stages}")

        planned = plan_work(
            instance, engine, stage_assets, jobs=jobs, count_in_flight=False, rerequest_after_s=0
        )
        if not planned:
            due = next_due(engine)
            time.sleep(idle_poll_s if due is None else min(max(due, 0.05), idle_poll_s * 5))
            continue
        record_requests(engine, planned)
        for run in planned:
            job = defs.resolve_job_def(run.request.job_name)
            result = job.execute_in_process(
                instance=instance,
                tags=run.request.tags,
                run_config={"loggers": {"console": {"config": {"log_level": log_level}}}},
                raise_on_error=False,
            )
            runs += 1
            if not result.success:
                failed += 1
                store.release_run(result.run_id, f"run {result.run_id} failed", count_attempt=True)
            on_tick()


def _stages(store: LeaseStore, projects: Sequence[str]) -> dict[str, str]:
    import sqlalchemy as sa

    with store.engine.connect() as c:
        rows = c.execute(
            sa.text(
                "SELECT name, stage FROM dataminer.projects WHERE name = ANY(CAST(:n AS text[]))"
            ),
            {"n": list(projects)},
        ).all()
    found = dict(rows)
    missing = set(projects) - set(found)
    if missing:
        raise ValueError(f"unknown projects: {sorted(missing)}")
    return found
