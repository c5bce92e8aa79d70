"""Running the real asset graph in tests: resources on the test database, range runs over
dynamic partitions, and small synthetic media."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.assets.stage import REQUESTED_BY_TAG
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.downloading import SearchHit
from dataminer_dagster.driver import DriveResult, drive
from dataminer_dagster.resources.database import DatabaseResource
from dataminer_dagster.resources.video_sources import YtDlpSources


class CannedSearchSources(YtDlpSources):
    """Real yt-dlp downloads; search results from a table, since YouTube cannot be reached."""

    results: dict[str, list[str]] = {}

    def search(self, query: str, max_results: int) -> list[SearchHit]:
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
        "video_sources": CannedSearchSources(),
        **extra,
    }


def pipeline_definitions(resources: dict) -> dg.Definitions:
    """The product's stage assets and their jobs, on test resources (what `drive` executes)."""
    from dataminer_dagster.assets import STAGE_ASSETS
    from dataminer_dagster.sensors.pipeline_sensors import stage_jobs

    return dg.Definitions(
        assets=list(STAGE_ASSETS.values()),
        jobs=list(stage_jobs(STAGE_ASSETS).values()),
        resources=resources,
    )


def drive_quietly(
    projects: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    defs: dg.Definitions,
    store: LeaseStore,
    timeout_s: float = 300,
) -> DriveResult:
    """`dataminer run`'s loop, without its log lines; a lease counts as stale after a minute."""
    return drive(
        projects,
        instance=instance,
        defs=defs,
        store=store,
        stale_after_s=60,
        timeout_s=timeout_s,
        log=lambda message: None,
    )


def materialize_partitions(
    assets: Sequence[dg.AssetsDefinition],
    keys: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    resources: dict,
    partitions: dg.DynamicPartitionsDefinition,
    selection: Sequence[dg.AssetsDefinition] | None = None,
    by_sensor: bool = False,
    raise_on_error: bool = True,
    run_config: dict | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize `keys` (added to the instance if new) in one run, as the sensors do."""
    existing = set(instance.get_dynamic_partitions(partitions.name))
    instance.add_dynamic_partitions(partitions.name, [k for k in keys if k not in existing])
    order = instance.get_dynamic_partitions(partitions.name)
    wanted = sorted(keys, key=order.index)
    tags = {
        "dagster/asset_partition_range_start": wanted[0],
        "dagster/asset_partition_range_end": wanted[-1],
    }
    if by_sensor:
        tags[REQUESTED_BY_TAG] = "sensor"
    return dg.materialize(
        assets,
        instance=instance,
        resources=resources,
        tags=tags,
        selection=selection,
        raise_on_error=raise_on_error,
        run_config=run_config,
    )


def materialized_partitions(result: dg.ExecuteInProcessResult, asset: str) -> list[str]:
    return sorted(
        e.event_specific_data.materialization.partition
        for e in result.get_asset_materialization_events()
        if e.asset_key == dg.AssetKey(asset)
    )


def work_items(engine: sa.Engine, stage: str) -> dict[str, sa.Row]:
    with engine.connect() as c:
        rows = c.execute(
            sa.text("SELECT * FROM dataminer.work_items WHERE stage = :s ORDER BY id"), {"s": stage}
        ).all()
    return {r.item_key: r for r in rows}


def write_videos(root: Path, names: dict[str, SyntheticVideoSpec]) -> dict[str, Path]:
    return {name: write_opencv_video(root / name, spec) for name, spec in names.items()}
