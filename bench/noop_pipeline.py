"""The pipeline with stages that do no media work, for bench/orchestration.py; also a Dagster
code location (`defs`), so that a real dagster-daemon can run it with the product's sensors.

downloads, frames and filtered_frames only record their result and queue the next stage, exactly
as the real ones do; the project stages do nothing. Each records the seconds it spent in its
work item's outcome (`work_s`), so that the benchmark can subtract them from the wall time.
"""

from __future__ import annotations

import time


def _timed(function):
    def wrapper(item, ctx):
        started = time.perf_counter()
        result = function(item, ctx)
        result.outcome = {**(result.outcome or {}), "work_s": time.perf_counter() - started}
        return result

    wrapper.__name__ = function.__name__
    wrapper.__doc__ = function.__doc__
    return wrapper


def build_noop_stages():
    from dataminer_dagster.engine.outcomes import ItemResult
    from dataminer_dagster.engine.stage_asset import stage_asset
    from dataminer_dagster.registry import DATASET, DEDUP, DETECT, DOWNLOAD, FILTER, FRAMES

    @stage_asset(stage=DOWNLOAD)
    @_timed
    def downloads(item, ctx):
        """No-op: the video is already there."""
        catalog = ctx.catalog
        return ItemResult(commit=lambda conn: catalog.advance_videos(conn, [item.video_id]))

    @stage_asset(stage=FRAMES)
    @_timed
    def frames(item, ctx):
        """No-op: an empty frames directory for each profile."""
        catalog = ctx.catalog
        projects = catalog.videos.linked_projects([item.video_id])[item.video_id]
        profiles = {p.config.extract.options().profile_id() for p in projects}

        def commit(conn):
            for profile in profiles:
                directory = ctx.db.paths.frames_dir(item.video_id, profile)
                directory.mkdir(parents=True, exist_ok=True)
                catalog.frames.record(conn, item.video_id, profile, {}, directory, 0)
            catalog.advance_videos(conn, [item.video_id])

        return ItemResult(commit=commit)

    def noop(name, stage):
        def asset(item, ctx):
            return ItemResult()

        asset.__name__ = name
        return stage_asset(stage=stage)(_timed(asset))

    return {
        DOWNLOAD: downloads,
        FRAMES: frames,
        FILTER: noop("filtered_frames", FILTER),
        DEDUP: noop("deduped_set", DEDUP),
        DETECT: noop("detections", DETECT),
        DATASET: noop("dataset", DATASET),
    }


def build_definitions(with_sensors: bool):
    import dagster as dg

    from dataminer_dagster.engine.assembly import pipeline_assets
    from dataminer_dagster.engine.jobs import lane_jobs
    from dataminer_dagster.lanes import configured_lanes
    from dataminer_dagster.resources.db import DatabaseResource
    from dataminer_dagster.sensors.pipeline_sensors import build_sensors
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    lanes = configured_lanes(settings)
    stages = build_noop_stages()
    jobs = lane_jobs(stages, lanes)
    return stages, dg.Definitions(
        assets=pipeline_assets(stages, lanes),
        jobs=list(jobs.values()),
        sensors=build_sensors(stages, jobs, lanes, settings) if with_sensors else [],
        resources={"db": DatabaseResource()},
        executor=dg.in_process_executor,
    )


def __getattr__(name: str):
    """`defs`, built when a code server asks for it (not when the benchmark imports this)."""
    if name == "defs":
        return build_definitions(with_sensors=True)[1]
    raise AttributeError(name)
