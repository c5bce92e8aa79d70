"""Two projects sharing videos, with different prompts and detectors, each to its own dataset,
driven exactly as the sensors decide (dataminer_dagster.hosting.driver), with tiny real-architecture models."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.coco import validate_coco
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.reports import stage_counts
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.pipeline import (
    drive_quietly,
    pipeline_definitions,
    resources,
    write_videos,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_owlv2, build_tiny_yolo

    root = tmp_path_factory.mktemp("models")
    return {
        "siglip": build_tiny_siglip(root / "siglip"),
        "yolo": build_tiny_yolo(root / "yolo.pt"),
        "owlv2": build_tiny_owlv2(root / "owlv2"),
    }


def _config(
    name: str,
    files: list[str],
    models: dict[str, Path],
    *,
    prompts: list[str],
    detect: dict,
    out: Path,
):
    return parse_project_config(
        {
            "name": name,
            "output_dir": str(out / name),
            "inputs": {"files": files},
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(models["siglip"], prompts),
            "dedup": {"threshold": 0.99},
            "detect": {**detect, "device": "cpu", "confidence": 0.01},
        }
    )


def test_two_projects_sharing_videos_each_get_their_own_dataset(
    tmp_path, database_url, engine, tiny_models
):
    videos = write_videos(
        tmp_path / "videos",
        {
            f"clip{i}.mp4": SyntheticVideoSpec(
                width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=i
            )
            for i in range(3)
        },
    )
    files = [str(p) for p in videos.values()]
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    a = _config(
        "alpha",
        files,
        tiny_models,
        prompts=["a red square"],
        detect={
            "detector": "yolo",
            "model": str(tiny_models["yolo"]),
            "classes": ["person", "car"],
        },
        out=tmp_path / "out",
    )
    b = _config(
        "beta",
        files[:2],
        tiny_models,
        prompts=["a blue circle", "a shape"],
        detect={
            "detector": "owlv2",
            "model": str(tiny_models["owlv2"]),
            "prompts": ["circle", "square"],
        },
        out=tmp_path / "out",
    )
    for config in (a, b):
        catalog.projects.register(config)
    defs = pipeline_definitions(resources(database_url, data_dir))
    with instance_for_test() as instance:
        result = drive_quietly(
            ["alpha", "beta"], instance=instance, defs=defs, store=store, timeout_s=600
        )

    assert result.stages == {"alpha": "complete", "beta": "complete"}, result
    assert result.failed_runs == 0
    for config, n_videos, categories in ((a, 3, ["person", "car"]), (b, 2, ["circle", "square"])):
        root = tmp_path / "out" / config.name / "dataset"
        manifest = pd.read_parquet(root / "manifest.parquet")
        assert 1 <= len(manifest) <= n_videos * 4
        assert set(manifest["video_id"]) <= {v for v in catalog.videos.get([])} | set(
            manifest["video_id"]
        )
        assert manifest["video_id"].nunique() <= n_videos
        assert all((root / "images" / f).is_file() for f in manifest["file_name"])
        assert (root / "images" / manifest["file_name"][0]).stat().st_nlink >= 2, (
            "images are hard links"
        )
        coco = json.loads((root / "annotations.coco.json").read_text())
        validate_coco(coco)
        assert [c["name"] for c in coco["categories"]] == categories
        assert sorted(i["file_name"] for i in coco["images"]) == sorted(manifest["file_name"])
        assert set(manifest.columns) >= {
            "source_url",
            "timestamp",
            "pos_max",
            "group",
            "group_size",
            "detections",
        }
        counts = stage_counts(engine, catalog.projects.get(config.name).id)
        assert counts["filter"]["done"] == n_videos
        assert counts["dataset"]["done"] == 1

    # The shared videos were downloaded and extracted once.
    assert stage_counts(engine, catalog.projects.get("alpha").id)["frames"]["done"] == 3


def test_prompts_longer_than_the_text_model_reads_are_warned_and_keep_their_columns(
    tmp_path, database_url, engine, tiny_models
):
    """Such prompts were cut to the model's 64 tokens without a word (two alike up to the cut
    get the same scores) and became column names of their full length."""
    videos = write_videos(
        tmp_path / "videos", {"clip.mp4": SyntheticVideoSpec(width=96, height=64, seconds=1.0)}
    )
    parked, moving = ("a red car " * 40 + ending for ending in ("parked", "moving"))
    config = _config(
        "long",
        [str(videos["clip.mp4"])],
        tiny_models,
        prompts=[parked, moving, "a shape"],
        detect={"detector": "yolo", "model": str(tiny_models["yolo"])},
        out=tmp_path / "out",
    )
    store = LeaseStore(engine)
    Catalog(engine, store, DataPaths(tmp_path / "data")).projects.register(config)
    defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
    with instance_for_test() as instance:
        result = drive_quietly(["long"], instance=instance, defs=defs, store=store)
        messages = [
            e.user_message for run in instance.get_runs() for e in instance.all_logs(run.run_id)
        ]

    assert result.stages == {"long": "complete"}
    warnings = sorted(m for m in messages if "tokens long" in m)
    assert len(warnings) == 2, warnings
    for warning in warnings:
        assert f"filter long: the prompt '{parked[:60]}...' is " in warning
        assert (
            f"the model {tiny_models['siglip']} reads its first 64 and ignores the rest" in warning
        )
    manifest = pd.read_parquet(tmp_path / "out" / "long" / "dataset" / "manifest.parquet")
    columns = [c for c in manifest.columns if c.startswith("positive: ")]
    assert len(columns) == 3 and len(set(columns)) == 3, columns
    assert "positive: a shape" in columns
    assert [len(c) for c in columns if c != "positive: a shape"] == [110, 110]
    assert all(c.startswith(f"positive: {parked[:87]}... #") for c in columns[:2]), columns
