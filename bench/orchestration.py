"""Orchestration overhead: what the pipeline costs per video and stage when the stages do nothing.

N videos go through the real machinery (catalog rows, work items, the sensors' decisions, Dagster
runs with partition ranges, claims, completion transactions, materialization events, project
transitions) with stage functions that do no media work: downloads, frames and filtered_frames
only record their result and queue the next stage, exactly as the real ones do. The time spent
inside the stage functions is measured and subtracted; what is left is overhead.

Runs execute in this process, as `dataminer run` does (no process start per run), on a Dagster
instance whose storage is the embedded PostgreSQL, as with `DAGSTER_HOME=$PWD`.

    python bench/orchestration.py --videos 200 2000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

WORK_SECONDS = {"total": 0.0}


def _timed(function):
    def wrapper(item, ctx):
        started = time.perf_counter()
        try:
            return function(item, ctx)
        finally:
            WORK_SECONDS["total"] += time.perf_counter() - started

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


def build_noop_stages():
    from dataminer_dagster.assets.stage import ItemResult, stage_asset
    from dataminer_dagster.partitions import (
        project_videos_partitions,
        projects_partitions,
        videos_partitions,
    )
    from dataminer_dagster.stages import DATASET, DEDUP, DETECT, DOWNLOAD, FILTER, FRAMES

    @stage_asset(stage=DOWNLOAD, partitions_def=videos_partitions)
    @_timed
    def downloads(item, ctx):
        """No-op: the video is already there."""
        catalog = ctx.db.catalog
        return ItemResult(commit=lambda conn: catalog.advance_videos(conn, [item.video_id]))

    @stage_asset(stage=FRAMES, partitions_def=videos_partitions)
    @_timed
    def frames(item, ctx):
        """No-op: an empty frames directory for each profile."""
        catalog = ctx.db.catalog
        projects = catalog.linked_projects([item.video_id])[item.video_id]
        profiles = {p.config.extract.options().profile_id() for p in projects}

        def commit(conn):
            for profile in profiles:
                directory = ctx.db.paths.frames_dir(item.video_id, profile)
                directory.mkdir(parents=True, exist_ok=True)
                catalog.record_frames(conn, item.video_id, profile, {}, directory, 0)
            catalog.advance_videos(conn, [item.video_id])

        return ItemResult(commit=commit)

    def noop(name, stage, partitions):
        def asset(item, ctx):
            return ItemResult()

        asset.__name__ = name
        return stage_asset(stage=stage, partitions_def=partitions)(_timed(asset))

    return {
        DOWNLOAD: downloads,
        FRAMES: frames,
        FILTER: noop("filtered_frames", FILTER, project_videos_partitions),
        DEDUP: noop("deduped_set", DEDUP, projects_partitions),
        DETECT: noop("detections", DETECT, projects_partitions),
        DATASET: noop("dataset", DATASET, projects_partitions),
    }


def run(videos: int, root: Path) -> dict:
    import dagster as dg

    from dataminer_dagster.assets import lane_assets
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.catalog import Candidate, Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.schema import DONE
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.driver import drive
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.resources.database import DatabaseResource
    from dataminer_dagster.sensors.pipeline_sensors import lane_jobs
    from dataminer_dagster.settings import load_settings
    from dataminer_dagster.stages import CATALOG, LANES

    settings = load_settings()
    engine = get_engine(claims_database_url(settings))
    migrate.upgrade(engine)
    store = LeaseStore(engine, settings.retry)
    catalog = Catalog(engine, store, DataPaths(settings.data_dir))
    name = f"bench{videos}"
    sources = root / name
    sources.mkdir(parents=True)
    candidates = []
    for i in range(videos):
        path = sources / f"v{i:05d}.mp4"
        path.touch()
        candidates.append(Candidate(f"{name}-{i:05d}", "file", "bench", source_path=str(path)))
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"files": [str(sources / "*.mp4")]},
            "filter": {"positive_prompts": ["x"]},
        }
    )
    project = catalog.register_project(config).project
    with engine.begin() as conn:
        catalog.link_videos(conn, project, candidates)
        catalog.advance_videos(conn, [c.video_id for c in candidates])
        store.mark(CATALOG, name, DONE, "bench", project_id=project.id, conn=conn)

    stages = build_noop_stages()
    defs = dg.Definitions(
        assets=list(lane_assets(stages, LANES).values()),
        jobs=list(lane_jobs(stages, LANES).values()),
        resources={"db": DatabaseResource()},
        executor=dg.in_process_executor,
    )
    instance = dg.DagsterInstance.get()
    WORK_SECONDS["total"] = 0.0
    started = time.perf_counter()
    result = drive(
        [name],
        instance=instance,
        defs=defs,
        store=store,
        stale_after_s=600,
        log=lambda m: None,
        stages=stages,
    )
    wall = time.perf_counter() - started
    assert result.stages == {name: "complete"}, result
    video_stages = 3 * videos
    overhead = wall - WORK_SECONDS["total"]
    return {
        "videos": videos,
        "runs": result.runs,
        "wall_s": wall,
        "stage_work_s": WORK_SECONDS["total"],
        "overhead_per_video_stage_s": overhead / video_stages,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--videos", type=int, nargs="+", default=[200, 2000])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="bench-orchestration-") as tmp:
        root = Path(tmp)
        os.environ["DATAMINER_HOME"] = str(root / "home")
        os.environ["DAGSTER_HOME"] = str(root / "dagster")
        (root / "dagster").mkdir()
        repo_yaml = Path(__file__).resolve().parents[1] / "dagster.yaml"
        (root / "dagster" / "dagster.yaml").write_text(repo_yaml.read_text())
        print("| videos | runs | wall s | stage work s | overhead per video-stage |")
        print("|---:|---:|---:|---:|---:|")
        for n in args.videos:
            r = run(n, root)
            print(
                f"| {r['videos']:,} | {r['runs']} | {r['wall_s']:.1f} | {r['stage_work_s']:.2f} | "
                f"{r['overhead_per_video_stage_s'] * 1000:.1f} ms |",
                flush=True,
            )


if __name__ == "__main__":
    main()
