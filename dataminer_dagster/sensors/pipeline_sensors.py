"""The sensors that replace the monitor worker.

* discovery: new catalog rows become dynamic partitions (<= 25,000 per tick, cursor-chunked), and
  the partitions of deleted rows go
* work: claimable items become batched run requests, per stage (the per-video chain, project stages)
* transitions: projects move through dedup -> detect -> dataset -> complete, or reopen
* lease reaper: leases of runs that stopped heartbeating or finished come back, counted as attempts
* run failure / run cancelled: a run's leases are released at once

All run by default. They read and write the claim tables only; no network I/O happens here.
"""

from __future__ import annotations

from collections.abc import Mapping

import dagster as dg
from dagster._core.storage.dagster_run import FINISHED_STATUSES

from dataminer_dagster.db.project_flow import advance_projects
from dataminer_dagster.db.scheduling import clear_requested
from dataminer_dagster.resources.database import DatabaseResource
from dataminer_dagster.sensors.planning import (
    DiscoveryCursor,
    batch_range,
    plan_discovery,
    plan_work,
    record_requests,
)

RUNNING = dg.DefaultSensorStatus.RUNNING


def stage_jobs(
    stage_assets: Mapping[str, dg.AssetsDefinition],
) -> dict[str, dg.UnresolvedAssetJobDefinition]:
    """One job per stage (stage assets have different partition sets, so one run holds one)."""
    return {
        stage: dg.define_asset_job(
            f"{asset.key.to_user_string()}_job", selection=[asset], tags={"dataminer/stage": stage}
        )
        for stage, asset in stage_assets.items()
    }


def build_sensors(
    stage_assets: Mapping[str, dg.AssetsDefinition],
    jobs: Mapping[str, dg.UnresolvedAssetJobDefinition],
) -> list[dg.SensorDefinition]:
    """The pipeline's sensors for these stage assets (stage name -> asset) and their jobs."""
    partitions = {a.partitions_def.name: a.partitions_def for a in stage_assets.values()}

    @dg.sensor(name="discovery", minimum_interval_seconds=10, default_status=RUNNING)
    def discovery(context: dg.SensorEvaluationContext, db: DatabaseResource):
        """Adds a dynamic partition for every new project, video and project video; once every
        row has one, removes those whose row was deleted."""
        found = plan_discovery(
            db.store.engine, DiscoveryCursor.parse(context.cursor), instance=context.instance
        )
        if not found.count and not found.removals:
            return dg.SkipReason("no new or deleted projects or videos")
        context.log.info(
            ", ".join(
                [f"{len(keys)} new {name}" for name, keys in found.additions.items()]
                + [f"{len(keys)} deleted {name}" for name, keys in found.removals.items()]
            )
        )
        return dg.SensorResult(
            dynamic_partitions_requests=[
                partitions[name].build_add_request(keys) for name, keys in found.additions.items()
            ]
            + [
                partitions[name].build_delete_request(keys) for name, keys in found.removals.items()
            ],
            cursor=found.cursor.dump(),
        )

    @dg.sensor(
        name="work", minimum_interval_seconds=10, default_status=RUNNING, jobs=list(jobs.values())
    )
    def work(context: dg.SensorEvaluationContext, db: DatabaseResource):
        """Requests batched runs for claimable work items of every stage."""
        planned = plan_work(
            context.instance,
            db.store.engine,
            stage_assets,
            jobs={s: j.name for s, j in jobs.items()},
        )
        if not planned:
            return dg.SkipReason("no claimable work, or every stage has its share of runs")
        record_requests(db.store.engine, planned)
        summary: dict[str, int] = {}
        for p in planned:
            summary[p.stage] = summary.get(p.stage, 0) + len(p.item_ids)
        context.log.info("requested " + ", ".join(f"{s}: {n} items" for s, n in summary.items()))
        return dg.SensorResult(run_requests=[p.request for p in planned])

    @dg.sensor(name="project_transitions", minimum_interval_seconds=15, default_status=RUNNING)
    def project_transitions(context: dg.SensorEvaluationContext, db: DatabaseResource):
        """Moves projects to dedup, detect, dataset and complete; reopens them for new videos."""
        moved = advance_projects(db.store)
        for t in moved:
            context.log.info(f"project {t.project}: {t.old} -> {t.new} ({t.reason})")
        return dg.SkipReason(
            f"{len(moved)} project transitions" if moved else "no project can move"
        )

    @dg.sensor(name="lease_reaper", minimum_interval_seconds=30, default_status=RUNNING)
    def lease_reaper(context: dg.SensorEvaluationContext, db: DatabaseResource):
        """Takes back leases of runs that stopped heartbeating or that Dagster reports finished."""
        store = db.store
        owners = store.lease_owners()
        finished = (
            [
                r.dagster_run.run_id
                for r in context.instance.get_run_records(
                    dg.RunsFilter(run_ids=owners, statuses=FINISHED_STATUSES)
                )
            ]
            if owners
            else []
        )
        reaped = store.reap(db.settings.lease.stale_after_s, finished)
        for r in reaped:
            context.log.warning(
                f"{r.stage} {r.key}: lease of run {r.owner} taken back; now {r.status}"
            )
        return dg.SkipReason(
            f"reaped {len(reaped)} leases" if reaped else "every lease belongs to a live run"
        )

    @dg.run_failure_sensor(
        name="release_failed_runs", default_status=RUNNING, monitor_all_code_locations=True
    )
    def release_failed_runs(context: dg.RunFailureSensorContext, db: DatabaseResource):
        """A failed run's leases are released at once (the attempt counts)."""
        _release(context, db, "failed", count_attempt=True)

    @dg.run_status_sensor(
        name="release_cancelled_runs",
        run_status=dg.DagsterRunStatus.CANCELED,
        default_status=RUNNING,
        monitor_all_code_locations=True,
    )
    def release_cancelled_runs(context: dg.RunStatusSensorContext, db: DatabaseResource):
        """A cancelled run's leases are released at once (the attempt does not count)."""
        _release(context, db, "was cancelled", count_attempt=False)

    return [
        discovery,
        work,
        project_transitions,
        lease_reaper,
        release_failed_runs,
        release_cancelled_runs,
    ]


def _release(context, db: DatabaseResource, what: str, *, count_attempt: bool) -> None:
    run = context.dagster_run
    released = db.store.release_run(
        run.run_id, f"run {run.run_id} {what}", count_attempt=count_attempt
    )
    stage, batch = run.tags.get("dataminer/stage"), batch_range(run.tags)
    cleared = clear_requested(db.store.engine, stage, *batch) if stage and batch else 0
    if released or cleared:
        context.log.info(
            f"run {run.run_id} {what}: released {released} leases, {cleared} items can be requested again"
        )
