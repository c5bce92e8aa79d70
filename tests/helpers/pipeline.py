"""Running the real asset graph in tests: resources on the test database, range runs over
dynamic partitions, and small synthetic media."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.acquisition.ytdlp_search import SearchHit
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.engine.planning import RunLimits
from dataminer_dagster.engine.stage_asset import StageAsset
from dataminer_dagster.hosting.driver import DriveResult, drive
from dataminer_dagster.lanes import DEFAULT_LANES, Lane, lane_of
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import YtDlpClient
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.settings import LeasePolicy, RunPolicy
from dataminer_dagster.tags import RANGE_END, RANGE_START, REQUESTED_BY_TAG


class CannedSearchClient(YtDlpClient):
    """Real yt-dlp downloads; search results from a table, since YouTube cannot be reached."""

    results: dict[str, list[str]] = {}

    def search(self, query, max_results, options=None, throttle=None) -> list[SearchHit]:
        if query not in self.results:
            raise RuntimeError(f"no canned results for {query!r}")
        return [
            SearchHit(v, f"https://www.youtube.com/watch?v={v}", None, None)
            for v in self.results[query][:max_results]
        ]


def resources(database_url: str, data_dir: Path, **extra) -> dict:
    return {
        "db": DatabaseResource(
            database_url=database_url, data_dir=str(data_dir), heartbeat_seconds=1.0
        ),
        "download_client": CannedSearchClient(),
        "models": ModelsResource(),
        **extra,
    }


def pipeline_definitions(resources: dict, lanes: Sequence[Lane] = DEFAULT_LANES) -> dg.Definitions:
    """The product's lane assets and the jobs of `lanes`, on test resources (what `drive`
    executes), with the product's executor."""
    from dataminer_dagster.engine.jobs import lane_jobs
    from tests.helpers.stages import PIPELINE_ASSETS, STAGES

    return dg.Definitions(
        assets=PIPELINE_ASSETS,
        jobs=list(lane_jobs(STAGES, lanes).values()),
        resources=resources,
        executor=dg.in_process_executor,
    )


def one_stage_lanes() -> tuple[Lane, ...]:
    """Every stage in a lane of its own: runs stop between stages (to crash a stage on its own)."""
    return tuple(
        dataclasses.replace(lane, name=stage, only=(stage,), ahead=False)
        for lane in DEFAULT_LANES
        for stage in lane.stages
    )


def drive_quietly(
    projects: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    store: LeaseStore,
    timeout_s: float = 300,
    on_tick: Callable[[], None] = lambda: None,
) -> DriveResult:
    """`dataminer run`'s loop, without its log lines; a lease counts as stale after a minute."""
    return drive(
        projects,
        instance=instance,
        defs=defs,
        store=store,
        limits=RunLimits(LeasePolicy(heartbeat_s=1, stale_after_s=60), RunPolicy()),
        timeout_s=timeout_s,
        log=lambda message: None,
        on_tick=on_tick,
    )


def materialize_partitions(
    stages: Sequence[StageAsset],
    keys: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    resources: dict,
    partitions: dg.DynamicPartitionsDefinition,
    by_sensor: bool = False,
    raise_on_error: bool = True,
    redo: bool = False,
) -> dg.ExecuteInProcessResult:
    """Materialize `keys` (added to the instance if new) of these stages in one run, as the
    sensors do: their lanes' assets, with only these stages selected."""
    from tests.helpers.stages import LANE_ASSETS

    lanes = sorted({lane_of(s.stage).name for s in stages})
    existing = set(instance.get_dynamic_partitions(partitions.name))
    instance.add_dynamic_partitions(partitions.name, [k for k in keys if k not in existing])
    order = instance.get_dynamic_partitions(partitions.name)
    wanted = sorted(keys, key=order.index)
    tags = {RANGE_START: wanted[0], RANGE_END: wanted[-1]}
    if by_sensor:
        tags[REQUESTED_BY_TAG] = "sensor"
    return dg.materialize(
        [LANE_ASSETS[lane] for lane in lanes],
        instance=instance,
        resources=resources,
        tags=tags,
        selection=[s.key for s in stages],
        raise_on_error=raise_on_error,
        run_config={"ops": {f"{lane}_lane": {"config": {"redo": redo}} for lane in lanes}},
    )


def materialized_partitions(result: dg.ExecuteInProcessResult, asset: str) -> list[str]:
    """The partitions of `asset` the run did the work of (not those it recorded as current)."""
    return sorted(
        e.event_specific_data.materialization.partition
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(asset) and not recorded_as_current(e)
    )


def recorded_as_current(event) -> bool:
    """A materialization that says an earlier run did the partition's work."""
    outcome = event.event_specific_data.materialization.metadata.get("outcome")
    return outcome is not None and str(outcome.value).startswith("current:")


def work_items(engine: sa.Engine, stage: str) -> dict[str, sa.Row]:
    with engine.connect() as c:
        rows = c.execute(
            sa.text("SELECT * FROM dataminer.work_items WHERE stage = :s ORDER BY id"), {"s": stage}
        ).all()
    return {r.item_key: r for r in rows}


def write_videos(root: Path, names: dict[str, SyntheticVideoSpec]) -> dict[str, Path]:
    return {name: write_opencv_video(root / name, spec) for name, spec in names.items()}


def make_silent(engine: sa.Engine, run_ids: Sequence[str], *, longer_than_s: float) -> None:
    """Runs silent for longer than `longer_than_s` as the lease reaper counts it: the database up
    for longer than that (no silence counts from before it started: a test on a server started
    moments ago waits for it first), and their last heartbeat an hour ago."""
    import time

    with engine.connect() as c:
        up_s = c.execute(
            sa.text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
        ).scalar_one()
    time.sleep(max(0.0, longer_than_s + 0.1 - float(up_s)))
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.run_heartbeats SET heartbeat_at = now() - interval '1 hour'
                        WHERE run_id = ANY(CAST(:runs AS text[]))"""),
            {"runs": list(run_ids)},
        )
