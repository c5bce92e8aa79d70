"""Asset checks per partition (issue 15): a range run over several videos records one result per
video, on that video's partition, with numbers that plot and, where it fails, a description; and
what the dataset's and the COCO file's checks find in real files."""

from __future__ import annotations

import json
import stat
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dataminer_dagster.acquisition.video_ids import video_id_for_file
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.dataset.quality_checks import check_dataset
from dataminer_dagster.assets.detect.asset import check_coco_file
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.assets.frames.asset import frames
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import projects_partitions, videos_partitions
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.pipeline import materialize_partitions, resources, write_videos

SPEC = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.0)


@pytest.mark.slow
def test_a_missing_frame_fails_its_own_partitions_check_and_says_which(
    tmp_path, database_url, engine
):
    clips = write_videos(tmp_path / "videos", {"a.mp4": SPEC, "b.mp4": replace(SPEC, seed=1)})
    broken, intact = (video_id_for_file(clips[n]) for n in ("a.mp4", "b.mp4"))
    data_dir = tmp_path / "data"
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
    catalog.projects.register(
        parse_project_config(
            {
                "name": "p",
                "inputs": {"files": [str(p) for p in clips.values()]},
                "extract": {"strategy": "time", "every_seconds": 0.25},
                "filter": {"positive_prompts": ["a thing"]},
            }
        )
    )
    res = resources(database_url, data_dir)
    with instance_for_test() as instance:
        materialize_partitions(
            [video_catalog], ["p"], instance=instance, resources=res, partitions=projects_partitions
        )
        first = materialize_partitions(
            [downloads, frames],
            [broken, intact],
            instance=instance,
            resources=res,
            partitions=videos_partitions,
        )
        assert {(e.partition, e.passed) for e in first.get_asset_check_evaluations()} == {
            (broken, True),
            (intact, True),
        }
        # Dagster logs "did not yield or return expected outputs" for a check without its output.
        logged = [e.message or "" for e in instance.all_logs(first.run_id)]
        assert not [m for m in logged if "expected outputs" in m], logged

        directory = catalog.frames.profiles([broken])[broken].popitem()[1][0]
        lost = sorted(directory.glob(f"{broken}_*.jpg"))[1]
        directory.chmod(directory.stat().st_mode | stat.S_IWUSR)  # frames are kept read-only
        lost.unlink()
        again = materialize_partitions(
            [frames],
            [broken, intact],
            instance=instance,
            resources=res,
            partitions=videos_partitions,
            redo=True,
        )

    assert again.success, "a failed check is reported, it does not fail the run"
    results = {e.partition: e for e in again.get_asset_check_evaluations()}
    assert set(results) == {broken, intact}
    bad, good = results[broken], results[intact]
    assert (bad.check_name, bad.passed, good.passed) == ("frames_on_disk", False, True)
    assert {k: v.value for k, v in bad.metadata.items()} == {
        "missing_directories": 0,
        "missing_files": 1,
    }
    assert lost.name in bad.description and "redo: true" in bad.description
    assert good.description is None
    checked = {
        e.materialization.partition: e.materialization
        for e in (x.event_specific_data for x in again.get_asset_materialization_events())
    }
    assert (
        bad.target_materialization_data.run_id
        == again.run_id
        == good.target_materialization_data.run_id
    )
    assert checked[broken].metadata["outcome"].text.startswith("nothing to do")


def _dataset(root, names: list[str], *, coco_names: list[str] | None = None, files=None):
    """A dataset directory: a real manifest, real JPEGs, and a real COCO file."""
    from dataminer_dagster.core.coco import ImageDetections, build_coco, write_coco
    from dataminer_dagster.core.images import write_image

    (root / "images").mkdir(parents=True)
    for name in names if files is None else files:
        write_image(root / "images" / name, np.full((24, 32, 3), 90, np.uint8))
    pd.DataFrame({"file_name": names}).to_parquet(root / "manifest.parquet")
    images = [ImageDetections(n, 32, 24) for n in (names if coco_names is None else coco_names)]
    write_coco(build_coco(images, ["car"]), root / "annotations.coco.json")
    return root


def test_a_complete_dataset_counts_the_same_three_ways(tmp_path):
    root = _dataset(tmp_path / "dataset", ["a.jpg", "b.jpg"])
    result = check_dataset(root, with_coco=True)
    assert result.passed and result.description is None
    assert result.metadata == {
        "images": 2,
        "manifest_rows": 2,
        "coco_images": 2,
        "missing_files": 0,
    }


@pytest.mark.parametrize(
    "coco_names, files, expected, said",
    [
        (["a.jpg"], None, {"coco_images": 1}, "the counts differ"),
        (None, ["a.jpg"], {"images": 1, "missing_files": 1}, "`b.jpg`"),
    ],
)
def test_an_incomplete_dataset_says_what_is_wrong(tmp_path, coco_names, files, expected, said):
    root = _dataset(tmp_path / "dataset", ["a.jpg", "b.jpg"], coco_names=coco_names, files=files)
    result = check_dataset(root, with_coco=True)
    assert not result.passed
    assert expected.items() <= result.metadata.items()
    assert said in result.description and str(root) in result.description


def test_a_dataset_without_detection_has_no_coco_count(tmp_path):
    root = _dataset(tmp_path / "dataset", ["a.jpg"])
    (root / "annotations.coco.json").unlink()
    result = check_dataset(root, with_coco=False)
    assert result.passed and "coco_images" not in result.metadata


def test_a_broken_coco_file_counts_its_invalid_annotations(tmp_path):
    path = tmp_path / "annotations.coco.json"
    path.write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "a.jpg", "width": 32, "height": 24}],
                "categories": [{"id": 1, "name": "car", "supercategory": "object"}],
                "annotations": [
                    {
                        "id": 1,
                        "image_id": 1,
                        "category_id": 1,
                        "bbox": [1, 1, 4, 4],
                        "area": 16,
                        "iscrowd": 0,
                    },
                    {
                        "id": 2,
                        "image_id": 7,
                        "category_id": 1,
                        "bbox": [1, 1, 4, 4],
                        "area": 16,
                        "iscrowd": 0,
                    },
                    {
                        "id": 3,
                        "image_id": 1,
                        "category_id": 9,
                        "bbox": [1, 1, 4, 4],
                        "area": 16,
                        "iscrowd": 0,
                    },
                ],
            }
        )
    )
    result = check_coco_file(path)
    assert not result.passed
    assert result.metadata == {
        "images": 1,
        "annotations": 3,
        "invalid_annotations": 2,
        "other_problems": 0,
    }
    assert "annotations[1].image_id 7 does not name a listed image" in result.description

    path.write_text("{not json")
    assert "not readable JSON" in check_coco_file(path).description
    assert "missing" in check_coco_file(tmp_path / "nothing.json").description


def _formats_dataset(root):
    """A dataset with every format, as the dataset stage writes it (tests/core)."""
    from dataminer_dagster.assets.dataset.dataset_formats import read_contents, write_formats
    from tests.core.test_dataset_formats import make_dataset

    make_dataset(root)
    write_formats(root, read_contents(root), ["coco", "yolo", "hf"], published_at=root)
    return root


def test_the_split_checks_pass_on_a_dataset_as_written_and_say_what_breaks(tmp_path):
    from dataminer_dagster.assets.dataset.quality_checks import check_splits

    root = _formats_dataset(tmp_path / "dataset")
    result = check_splits(root, ["coco", "yolo", "hf"], with_boxes=True)
    assert result.passed, result.description
    assert result.metadata["val_manifest_rows"] == result.metadata["val_yolo_labels"] == 2

    (root / "yolo" / "labels" / "val" / "v3_000005.txt").unlink()
    (root / "hf" / "test" / "v4_000000.jpg").unlink()
    broken = check_splits(root, ["coco", "yolo", "hf"], with_boxes=True)
    assert not broken.passed
    assert "val: 2 manifest rows but 1 yolo labels" in broken.description
    assert "test: 1 manifest rows but 0 hf images" in broken.description

    plain = _dataset(tmp_path / "plain", ["a.jpg"])  # a manifest without splits: all differ
    pd.DataFrame({"file_name": ["a.jpg"], "split": ["train"]}).to_parquet(
        plain / "manifest.parquet"
    )
    missing = check_splits(plain, ["coco", "hf"], with_boxes=True)
    assert "the coco folder is missing; the hf folder is missing" in missing.description
    assert check_splits(plain, ["coco"], with_boxes=False).passed  # no boxes: no coco splits


def test_a_video_or_a_near_duplicate_group_across_splits_is_a_leak(tmp_path):
    from dataminer_dagster.assets.dataset.quality_checks import check_no_pairs_across_splits

    root = _formats_dataset(tmp_path / "dataset")
    table = tmp_path / "frames.parquet"
    # v3 is in val, v4 in test: a dropped frame of v4 in the group of a kept v3 frame
    groups = {"video_id": ["v1", "v1", "v2", "v3", "v3", "v4", "v4", "v9"]}
    pd.DataFrame({**groups, "group": [0, 1, 2, 3, 4, 5, 5, -1]}).to_parquet(table)
    assert check_no_pairs_across_splits(root, table).passed
    pd.DataFrame({**groups, "group": [0, 1, 2, 3, 4, 5, 3, -1]}).to_parquet(table)
    leak = check_no_pairs_across_splits(root, table)
    assert not leak.passed and leak.metadata == {
        "videos_in_two_splits": 0,
        "pairs_across_splits": 1,
    }

    manifest = pd.read_parquet(root / "manifest.parquet")
    manifest.loc[manifest["file_name"] == "v3_000005.jpg", "split"] = "train"
    manifest.to_parquet(root / "manifest.parquet")
    split_video = check_no_pairs_across_splits(root, table)
    assert split_video.metadata["videos_in_two_splits"] == 1 and "`v3`" in split_video.description


def test_provenance_splits_and_image_quality_say_their_numbers(tmp_path):
    from dataminer_dagster.assets.dataset.config import DatasetConfig
    from dataminer_dagster.assets.dataset.quality_checks import (
        check_image_quality,
        check_provenance,
        check_splits_filled,
    )

    root = _formats_dataset(tmp_path / "dataset")
    assert check_provenance(root).passed
    assert check_splits_filled(root, {"train": 0.8, "val": 0.1, "test": 0.1}).passed
    manifest = pd.read_parquet(root / "manifest.parquet")
    manifest.loc[0, "source_url"] = "  "
    manifest["split"] = manifest["split"].replace({"test": "val"})
    manifest["sharpness"] = [5.0, 500, 500, 500, 500, 500]
    manifest["brightness"] = [100.0, 10, 250, 251, 100, 100]
    manifest.to_parquet(root / "manifest.parquet")

    provenance = check_provenance(root)
    assert not provenance.passed and provenance.metadata == {"images": 6, "without_source": 1}
    assert "`v1_000000.jpg`" in provenance.description
    filled = check_splits_filled(root, {"train": 0.8, "val": 0.1, "test": 0.1})
    assert not filled.passed and filled.metadata["test_images"] == 0
    assert "The test split is empty" in filled.description
    assert check_splits_filled(root, {"train": 0.9, "val": 0.1, "test": 0.0}).passed
    quality = check_image_quality(root, DatasetConfig())
    assert not quality.passed
    assert quality.metadata == {"images": 6, "blurry": 1, "dark": 1, "overexposed": 2}
    assert "1 blurry, 1 dark, 2 overexposed" in quality.description
