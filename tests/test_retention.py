"""Cleanup and backup never break a later project: deleted videos are fetched again, deleted frames
extracted again, and frames are only deleted once every project using them is done with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_lifecycle import force_stage
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    drive_quietly,
    pipeline_definitions,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow


def _config(name, urls, model, out: Path, **sections):
    return parse_project_config(
        {
            "name": name,
            "output_dir": str(out / name),
            "inputs": {"urls": urls},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": {
                "model": str(model),
                "device": "cpu",
                "positive_prompts": ["a shape"],
                "positive_threshold": 0.0,
            },
            **sections,
        }
    )


def test_cleanup_and_backup_then_a_later_project_gets_everything_back(
    tmp_path, database_url, engine, tiny_siglip
):
    www = tmp_path / "www"
    write_videos(
        www,
        {
            f"v{i}.mp4": SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.5, seed=i)
            for i in range(2)
        },
    )
    data_dir, backup_dir = tmp_path / "data", tmp_path / "backup"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    defs = pipeline_definitions(resources(database_url, data_dir))
    with LocalHTTPServer(www) as server, instance_for_test() as instance:
        urls = [server.url(f"/v{i}.mp4") for i in range(2)]
        first = _config(
            "first",
            urls,
            tiny_siglip,
            tmp_path / "out",
            cleanup={"delete_videos_after_extraction": True},
            backup={"dest": str(backup_dir), "delete_after_backup": True},
        )
        catalog.projects.register(first)
        result = drive_quietly(["first"], instance=instance, defs=defs, store=store)
        assert result.stages == {"first": "complete"}
        # The backup stage may finish after the project: drive it until no backup work is left.
        drive_quietly(["first"], instance=instance, defs=defs, store=store, timeout_s=60)

        ids = sorted(r for r in work_items(engine, "download"))
        rows = catalog.videos.get(ids)
        assert all(rows[v].file_path is None for v in ids), (
            "downloaded files were deleted after extraction"
        )
        assert not list((data_dir / "videos").glob("*.mp4"))
        backups = work_items(engine, "backup")
        assert {k: r.status for k, r in backups.items()} == {v: "done" for v in ids}
        for v in ids:
            assert sorted(p.name for p in (backup_dir / v).rglob("*.jpg")), (
                "frames are in the backup"
            )
        assert catalog.frames.profiles(ids) == {}, (
            "frames were deleted after a verified backup, the project being done"
        )
        dataset = tmp_path / "out" / "first" / "dataset" / "images"
        assert list(dataset.iterdir()) and all(p.stat().st_size for p in dataset.iterdir()), (
            "the dataset keeps its images"
        )

        # Forcing dedup again after the frames went extracts and filters them again first.
        frames_before = {k: r.finished_at for k, r in work_items(engine, "frames").items()}
        dedup_before = work_items(engine, "dedup")["first"].finished_at
        forced = force_stage(catalog, "first", "dedup")
        assert forced.frames_released == ids and forced.unfinished_members == len(ids)
        result = drive_quietly(["first"], instance=instance, defs=defs, store=store)
        assert result.stages == {"first": "complete"}
        assert all(work_items(engine, "frames")[v].finished_at > frames_before[v] for v in ids)
        dedup = work_items(engine, "dedup")["first"]
        assert dedup.status == "done" and dedup.finished_at > dedup_before
        assert dedup.attempts == 1 and dedup.last_error is None
        assert list(dataset.iterdir()), "the dataset was made again from the frames"

        # A later project with other sampling needs the same videos: fetched and extracted again.
        second = _config(
            "second",
            urls,
            tiny_siglip,
            tmp_path / "out",
            extract={"strategy": "time", "every_seconds": 1.0},
        )
        catalog.projects.register(second)
        result = drive_quietly(["second"], instance=instance, defs=defs, store=store)
        assert result.stages == {"second": "complete"}
        assert work_items(engine, "download")[ids[0]].attempts >= 1
        assert all(catalog.frames.profiles([v]).get(v) for v in ids), (
            "frames exist again for the new project"
        )


def test_a_backup_onto_the_frame_store_is_refused_and_the_frames_stay(
    tmp_path, database_url, engine, tiny_siglip
):
    """rsync verifies a copy onto the frame store against itself; with delete_after_backup the
    only copy would go. Registration refuses such a destination; a project registered before
    that check existed gets its backup item failed with the reason, and keeps its frames."""
    from dataminer_dagster.paths import UnsafePathError

    www = tmp_path / "www"
    write_videos(www, {"v0.mp4": SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.0)})
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    backup = {"dest": str(data_dir / "frames" / "copy"), "delete_after_backup": True}
    with LocalHTTPServer(www) as server, instance_for_test() as instance:
        config = _config("onto", [server.url("/v0.mp4")], tiny_siglip, tmp_path / "out")
        with pytest.raises(UnsafePathError, match="backup.dest .* overlaps the data directory"):
            catalog.projects.register(config.model_copy(update={"backup": _backup(backup)}))
        catalog.projects.register(config)
        with engine.begin() as conn:  # as a registration made before the check would be
            conn.exec_driver_sql(
                "UPDATE dataminer.projects SET config = jsonb_set(config, '{backup}', %s::jsonb)",
                (json.dumps(backup),),
            )
        defs = pipeline_definitions(resources(database_url, data_dir))
        result = drive_quietly(["onto"], instance=instance, defs=defs, store=store, timeout_s=60)
        assert result.stages == {"onto": "complete"}
        (item,) = work_items(engine, "backup").values()
        assert (
            item.status in ("failed", "dead") and "overlaps the data directory" in item.last_error
        )
        (video,) = work_items(engine, "download")
        assert catalog.frames.profiles([video]), "the frames were not released"
        assert not (data_dir / "frames" / "copy").exists()


def _backup(raw: dict):
    from dataminer_dagster.assets.backup.config import BackupConfig

    return BackupConfig.model_validate(raw)
