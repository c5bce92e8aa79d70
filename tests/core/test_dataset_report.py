"""The quality report's numbers (assets/dataset/dataset_report.py) on a dataset whose answers are known, and
its Markdown and plots on disk."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dataminer_dagster.assets.dataset.dataset_formats import read_contents
from dataminer_dagster.assets.dataset.dataset_report import Thresholds, summarize, write_report
from dataminer_dagster.core.images import read_image
from tests.core.test_dataset_formats import make_dataset

THRESHOLDS = Thresholds(
    blurry_below=100, dark_below=40, overexposed_above=215, positive_threshold=0.3, confidence=0.25
)


def _manifest(root) -> pd.DataFrame:
    manifest = pd.read_parquet(root / "manifest.parquet")
    n = len(manifest)
    manifest["sharpness"] = [50.0, 500.0, 20.0, 300.0, 300.0, 300.0][:n]  # two blurry
    manifest["brightness"] = [10.0, 120.0, 250.0, 120.0, np.nan, 30.0][:n]  # two dark, one over
    manifest["pos_max"] = np.linspace(0.31, 0.9, n)
    manifest["group"] = [0, 1, 2, 3, 4, 5][:n]
    return manifest


def test_the_numbers_count_splits_classes_videos_quality_and_provenance(tmp_path):
    root = make_dataset(tmp_path / "dataset")
    manifest = _manifest(root)
    manifest.loc[2, "source_url"] = None
    contents = read_contents(root)
    # the dedup table: every kept frame, plus frames dedup dropped: one of v1 in the group of a
    # kept v1 frame (same split), one of v4 in the group of a kept v3 frame (another split)
    dedup = [*zip(manifest["video_id"], manifest["group"], strict=True), ("v1", 0), ("v4", 3)]
    dedup.append(("v9", -1))  # unreadable: no group

    report = summarize(
        manifest,
        contents.images,
        contents.names,
        dedup,
        ratios={"train": 0.8, "val": 0.1, "test": 0.1},
        seed=4,
        thresholds=THRESHOLDS,
        warnings=["a warning"],
    )

    assert report.images == 6
    assert report.per_split == {"train": 3, "val": 2, "test": 1}
    assert report.videos_per_split == {"train": 2, "val": 1, "test": 1}
    assert report.per_video[0] == ("v1", "video v1", "train", 2)
    assert {c: r.boxes for c, r in report.classes.items()} == {
        "car": {"train": 2, "val": 0, "test": 1},
        "person": {"train": 1, "val": 1, "test": 0},
    }
    car = report.classes["car"]
    assert car.images == 3 and car.mean_score == np.mean([0.9, 0.4, 0.8])
    assert car.smallest_area == (10 / 96) * (10 / 64)
    assert report.near_duplicate_pairs == 0
    assert report.pairs_across_splits == 1  # the dropped v4 frame and the kept v3 frame of group 3
    assert report.removed_duplicates == 2
    assert (report.blurry, report.dark, report.overexposed) == (2, 2, 1)
    assert (report.with_source, report.without_source) == (5, 1)


def test_the_report_is_markdown_with_its_plots_and_an_overview_picture(tmp_path):
    root = make_dataset(tmp_path / "dataset")
    manifest = _manifest(root)
    contents = read_contents(root)
    report = summarize(
        manifest,
        contents.images,
        contents.names,
        zip(manifest["video_id"], manifest["group"], strict=True),
        ratios={"train": 0.8, "val": 0.1, "test": 0.1},
        seed=0,
        thresholds=THRESHOLDS,
        warnings=["the test split is empty: ..."],
    )
    picture = write_report(
        report,
        manifest,
        contents.images,
        root,
        title="dataset of project p",
        formats={"yolo": {"train": 3, "val": 2, "test": 1}},
    )

    text = (root / "report.md").read_text()
    assert text.startswith("# Quality report: dataset of project p\n")
    assert "- the test split is empty: ..." in text
    assert "| train | 80% | 3 | 50% | 2 |" in text
    assert "| near-duplicate pairs across splits (must be 0) | 0 |" in text
    assert "| blurry | sharpness below 100 | 2 | 33.3% |" in text
    assert "6 of 6 images have a source URL or path." in text
    assert "- yolo: train 3, val 2, test 1 images" in text
    for plot in ("splits", "classes", "videos", "quality", "scores"):
        assert f"(report/{plot}.png)" in text
        assert read_image(root / "report" / f"{plot}.png").shape[2] == 3
    assert picture.ndim == 3 and picture.shape[2] == 3 and picture.shape[1] > 600


def test_a_report_without_boxes_says_so(tmp_path):
    root = make_dataset(tmp_path / "dataset", with_coco=False)
    manifest = _manifest(root)
    contents = read_contents(root)
    report = summarize(
        manifest,
        contents.images,
        contents.names,
        [],
        ratios={"train": 1.0},
        seed=0,
        thresholds=Thresholds(100, 40, 215, 0.3, None),
    )
    write_report(report, manifest, contents.images, root, title="t", formats={})
    text = (root / "report.md").read_text()
    assert report.classes == {}
    assert "No boxes: the project has no detect section." in text
    assert not (root / "report" / "classes.png").exists()
