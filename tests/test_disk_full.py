"""A disk that fills, in any stage: the item is postponed without using an attempt, no staging is
left behind to keep the disk full, and the next item goes on once there is room. Real small
filesystems (tests/helpers/small_disk.py), real yt-dlp against a local server, real PostgreSQL."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pytest

from dataminer_dagster.acquisition.video_ids import video_id_for_file, video_id_for_url
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.assets.filter.asset import filtered_frames
from dataminer_dagster.assets.frames.asset import frames
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import (
    project_videos_partitions,
    projects_partitions,
    videos_partitions,
)
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    drive_quietly,
    materialize_partitions,
    pipeline_definitions,
    resources,
    work_items,
    write_videos,
)
from tests.helpers.small_disk import fill, small_disk

pytestmark = pytest.mark.slow

SMALL = SyntheticVideoSpec(width=160, height=120, fps=10, seconds=1.0)


def _observations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, str]]:
    return {
        e.event_specific_data.asset_observation.partition: {
            k: str(getattr(v, "value", v))
            for k, v in e.event_specific_data.asset_observation.metadata.items()
        }
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }


def _hidden(directory: Path) -> list[str]:
    """Staging and work directories (hidden names) anywhere under `directory`."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(".*"))


def test_a_disk_that_fills_during_a_download_postpones_it_and_frees_the_space(
    tmp_path, database_url, engine
):
    www = tmp_path / "www"
    write_videos(www, {"good.mp4": SMALL})
    with LocalHTTPServer(www) as server, small_disk(tmp_path / "data", size_mb=4) as data_dir:
        server.stream("/huge.mp4", total_bytes=64 * 2**20)  # no announced size to refuse it by
        names = ["huge.mp4", "good.mp4"]
        ids = {name: video_id_for_url(server.url(f"/{name}")) for name in names}
        config = parse_project_config(
            {
                "name": "p1",
                "inputs": {"urls": [server.url(f"/{n}") for n in names]},
                # No reserve: the disk is found full by the write that fills it.
                "download": {
                    "allow_private_networks": True,
                    "min_free_disk_mb": 0,
                    "max_filesize_mb": 1024,
                },
                "filter": {"positive_prompts": ["a thing"]},
            }
        )
        Catalog(engine, LeaseStore(engine), DataPaths(data_dir)).projects.register(config)
        res = resources(database_url, data_dir)
        with instance_for_test() as instance:
            materialize_partitions(
                [video_catalog],
                ["p1"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )
            huge = materialize_partitions(
                [downloads],
                [ids["huge.mp4"]],
                instance=instance,
                resources=res,
                partitions=videos_partitions,
            )
            item = work_items(engine, "download")[ids["huge.mp4"]]
            assert (item.status, item.attempts) == ("failed", 0), "the disk's fault: no attempt"
            assert "the disk is full" in item.last_error
            assert "No space left on device" in item.last_error
            assert _observations(huge)[ids["huge.mp4"]]["outcome"] == "postponed"
            assert _hidden(data_dir / "videos") == [], "the partial download is gone"

            materialize_partitions(
                [downloads],
                [ids["good.mp4"]],
                instance=instance,
                resources=res,
                partitions=videos_partitions,
            )
        assert work_items(engine, "download")[ids["good.mp4"]].status == "done"
        assert (data_dir / "videos" / f"{ids['good.mp4']}.mp4").is_file()


def test_a_disk_that_fills_during_extraction_postpones_it_and_leaves_no_staging(
    tmp_path, database_url, engine
):
    # Local files: they are decoded where they are, only the frames go to the small disk.
    clips = write_videos(
        tmp_path / "clips",
        {"big.mp4": replace(SMALL, width=640, height=480, seconds=4.0), "small.mp4": SMALL},
    )
    ids = {name: video_id_for_file(path) for name, path in clips.items()}
    with small_disk(tmp_path / "data", size_mb=4) as data_dir:
        configs = [
            parse_project_config(
                {
                    "name": name,
                    "inputs": {"files": [str(clips[f"{name}.mp4"])]},
                    "extract": {"min_free_disk_mb": 0, **extract},
                    "filter": {"positive_prompts": ["a thing"]},
                }
            )
            for name, extract in (
                ("big", {"strategy": "interval", "every_frames": 1, "image_format": "png"}),
                ("small", {}),
            )
        ]
        catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
        for config in configs:
            catalog.projects.register(config)
        res = resources(database_url, data_dir)
        with instance_for_test() as instance:
            materialize_partitions(
                [video_catalog],
                ["big", "small"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )
            materialize_partitions(
                [downloads],
                list(ids.values()),
                instance=instance,
                resources=res,
                partitions=videos_partitions,
            )
            big = materialize_partitions(
                [frames],
                [ids["big.mp4"]],
                instance=instance,
                resources=res,
                partitions=videos_partitions,
            )
            item = work_items(engine, "frames")[ids["big.mp4"]]
            assert (item.status, item.attempts) == ("failed", 0), "the disk's fault: no attempt"
            assert "the disk is full" in item.last_error
            assert _observations(big)[ids["big.mp4"]]["outcome"] == "postponed"
            assert _hidden(data_dir / "frames") == [], "no staging left to keep the disk full"

            materialize_partitions(
                [frames],
                [ids["small.mp4"]],
                instance=instance,
                resources=res,
                partitions=videos_partitions,
            )
        assert work_items(engine, "frames")[ids["small.mp4"]].status == "done"


def test_a_full_disk_under_a_projects_outputs_postpones_its_filter(
    tmp_path, database_url, engine, tiny_siglip
):
    clip = write_videos(tmp_path / "clips", {"clip.mp4": SMALL})["clip.mp4"]
    video = video_id_for_file(clip)
    data_dir = tmp_path / "data"
    with small_disk(tmp_path / "out", size_mb=1) as out:
        config = parse_project_config(
            {
                "name": "p1",
                "output_dir": str(out / "p1"),
                "inputs": {"files": [str(clip)]},
                "filter": keep_every_frame(tiny_siglip, ["a thing"]),
            }
        )
        Catalog(engine, LeaseStore(engine), DataPaths(data_dir)).projects.register(config)
        res = resources(database_url, data_dir)
        with instance_for_test() as instance:
            materialize_partitions(
                [video_catalog],
                ["p1"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )
            for stage in (downloads, frames):
                materialize_partitions(
                    [stage], [video], instance=instance, resources=res, partitions=videos_partitions
                )
            filler = fill(out)
            key = f"p1.{video}"
            result = materialize_partitions(
                [filtered_frames],
                [key],
                instance=instance,
                resources=res,
                partitions=project_videos_partitions,
            )
            assert result.success, "a postponement does not fail a one-partition run"
            item = work_items(engine, "filter")[key]
            assert (item.status, item.attempts) == ("failed", 0), "the disk's fault: no attempt"
            assert "the disk is full" in item.last_error
            assert _hidden(out) == ["p1/.dataminer-project"], "no staging left in the outputs"

            filler.unlink()
            materialize_partitions(
                [filtered_frames],
                [key],
                instance=instance,
                resources=res,
                partitions=project_videos_partitions,
            )
        assert work_items(engine, "filter")[key].status == "done"


def test_a_long_wait_for_disk_space_is_logged_once_a_minute_not_once_per_try(
    tmp_path, database_url, engine
):
    """Every try of every video meets a full disk; the log says so once, not at each try."""
    clips = write_videos(
        tmp_path / "clips", {f"clip{i}.mp4": replace(SMALL, seed=i) for i in range(3)}
    )
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"files": [str(p) for p in clips.values()]},
            "extract": {"min_free_disk_mb": 2**31 - 1},  # 2 PB: the disk is "full"
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    store = LeaseStore(engine)
    Catalog(engine, store, DataPaths(tmp_path / "data")).projects.register(config)
    defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
    with instance_for_test() as instance:
        with pytest.raises(TimeoutError):  # the disk never frees: the drive gives up
            drive_quietly(["p1"], instance=instance, defs=defs, store=store, timeout_s=10)
        runs = instance.get_runs()
        postponements = [
            observed
            for run in runs
            for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION)
            if (observed := e.dagster_event.event_specific_data.asset_observation)
            .metadata["outcome"]
            .value
            == "postponed"
        ]
        lines = [
            e.user_message
            for run in runs
            for e in instance.all_logs(run.run_id)
            if e.level == logging.WARNING and " postponed " in e.user_message
        ]
        failed = [run.run_id for run in runs if run.status == dg.DagsterRunStatus.FAILURE]
    assert len(lines) < len(postponements), f"not one line per try: {lines}, {len(postponements)}"
    assert len(lines) <= 2, f"one line a minute at most: {lines}"
    assert not failed, "waiting for disk space fails no run"


def test_what_a_killed_extraction_left_is_removed_before_the_free_space_is_checked(
    tmp_path, database_url, engine
):
    """A process killed mid-extraction leaves its staging behind; that leftover must not be what
    keeps the video postponed for want of space."""
    clip = write_videos(tmp_path / "clips", {"clip.mp4": SMALL})["clip.mp4"]
    video = video_id_for_file(clip)
    with small_disk(tmp_path / "data", size_mb=4) as data_dir:
        config = parse_project_config(
            {
                "name": "p1",
                "inputs": {"files": [str(clip)]},
                "extract": {"min_free_disk_mb": 2},
                "filter": {"positive_prompts": ["a thing"]},
            }
        )
        Catalog(engine, LeaseStore(engine), DataPaths(data_dir)).projects.register(config)
        final = DataPaths(data_dir).frames_dir(video, config.extract.options().profile_id())
        leftover = final.parent / f".staging-{final.name}-0badf00d"
        leftover.mkdir(parents=True)
        (leftover / f"{video}_000001.jpg").write_bytes(bytes(3 * 2**20))  # 3 of the 4 MB
        res = resources(database_url, data_dir)
        with instance_for_test() as instance:
            materialize_partitions(
                [video_catalog],
                ["p1"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )
            for stage in (downloads, frames):
                materialize_partitions(
                    [stage], [video], instance=instance, resources=res, partitions=videos_partitions
                )
        item = work_items(engine, "frames")[video]
        assert item.status == "done", item.last_error
        assert _hidden(data_dir / "frames") == [], "the leftover is gone"
