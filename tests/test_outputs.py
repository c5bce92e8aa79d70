"""A user's asset loads `dataset`, `deduped_set` and `detections` through the stages' IO manager:
one typed value per project partition, a dict for an unpartitioned asset, and an error that says
what to do when the project has no output yet. (The files here are written by hand; the
end-to-end tests in test_composition.py load what a real run wrote.)"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.outputs import (
    Dataset,
    DedupedSet,
    Detections,
    projects_partitions,
)
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.testing import instance_for_test
from tests.helpers.stages import LANE_ASSETS


def _register(engine, out: Path, name: str, *, detect: bool) -> Path:
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(out / "data"))
    raw = {
        "name": name,
        "output_dir": str(out / name),
        "inputs": {"files": [str(out / "clip.mp4")]},
        "filter": {"positive_prompts": ["x"]},
    }
    if detect:
        raw["detect"] = {"detector": "yolo", "model": "yolo11n.pt", "classes": ["car"]}
    catalog.projects.register(parse_project_config(raw))
    return out / name


def _write_outputs(root: Path) -> None:
    """What the dedup, detect and dataset stages leave in a project's output directory."""
    paths = ProjectPaths(root)
    frames = pd.DataFrame({"frame_id": [1, 2, 3], "kept": [True, False, True]})
    paths.dedup_table.parent.mkdir(parents=True)
    frames.to_parquet(paths.dedup_table)
    paths.detections_dir.mkdir()
    pd.DataFrame({"frame_id": [1], "label": ["car"]}).to_parquet(paths.detections_table)
    coco = {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [], "categories": []}
    paths.coco_file.write_text(json.dumps(coco))
    (paths.dataset_dir / "images").mkdir(parents=True)
    pd.DataFrame({"file_name": ["a.jpg", "c.jpg"]}).to_parquet(
        paths.dataset_dir / "manifest.parquet"
    )
    (paths.dataset_dir / "annotations.coco.json").write_text(json.dumps(coco))


@pytest.fixture
def resources(database_url, tmp_path):
    """The project lane carries its IO manager, which reads the claim database through `db`."""
    return {
        "db": DatabaseResource(database_url=database_url, data_dir=str(tmp_path / "data")),
        "models": ModelsResource(),
    }


@dg.asset(
    partitions_def=projects_partitions,
    ins={
        "dataset": dg.AssetIn(),
        "deduped_set": dg.AssetIn(),
        "detections": dg.AssetIn(),
    },
)
def summary(dataset: Dataset, deduped_set: DedupedSet, detections: Detections) -> dict:
    return {
        "images": dataset.images,
        "manifest_rows": len(dataset.read_manifest()),
        "arrow_rows": dataset.read_manifest_arrow().num_rows,
        "coco_images": len(dataset.read_coco()["images"]),
        "kept": len(deduped_set.read_kept()),
        "boxes": detections.boxes,
    }


def test_a_partitioned_asset_gets_the_typed_outputs_of_its_project(engine, tmp_path, resources):
    root = _register(engine, tmp_path / "out", "alpha", detect=True)
    _write_outputs(root)
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(projects_partitions.name, ["alpha"])
        result = dg.materialize(
            [LANE_ASSETS["project"], summary],
            selection=[summary],
            partition_key="alpha",
            instance=instance,
            resources=resources,
        )
    assert result.output_for_node("summary") == {
        "images": 2,
        "manifest_rows": 2,
        "arrow_rows": 2,
        "coco_images": 1,
        "kept": 2,
        "boxes": 1,
    }


def test_an_unpartitioned_asset_gets_every_project_with_output(engine, tmp_path, resources):
    _write_outputs(_register(engine, tmp_path / "out", "alpha", detect=False))
    _register(engine, tmp_path / "out", "beta", detect=False)  # no output yet

    @dg.asset(ins={"dataset": dg.AssetIn()})
    def all_datasets(dataset: dict[str, Dataset]) -> dict:
        return {name: d.images for name, d in dataset.items()}

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(projects_partitions.name, ["alpha", "beta"])
        result = dg.materialize(
            [LANE_ASSETS["project"], all_datasets],
            selection=[all_datasets],
            instance=instance,
            resources=resources,
        )
    assert result.output_for_node("all_datasets") == {"alpha": 2}


def test_a_project_without_output_says_what_to_do(engine, tmp_path, resources):
    _register(engine, tmp_path / "out", "alpha", detect=True)

    @dg.asset(partitions_def=projects_partitions, ins={"dataset": dg.AssetIn()})
    def needs_dataset(dataset: Dataset) -> None: ...

    with instance_for_test() as instance:
        instance.add_dynamic_partitions(projects_partitions.name, ["alpha"])
        result = dg.materialize(
            [LANE_ASSETS["project"], needs_dataset],
            selection=[needs_dataset],
            partition_key="alpha",
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.step_failure_data.error.cause.message
    assert "dataset alpha has no output yet" in message
    assert "Materialize dataset for alpha first" in message


def test_an_eager_asset_is_requested_when_its_projects_dataset_is_done():
    """What docs/extending.md says a user's asset does to follow each project: eager() asks for its
    partition once the stage has recorded the dataset's materialization."""

    @dg.asset(
        partitions_def=projects_partitions,
        ins={"dataset": dg.AssetIn()},
        automation_condition=dg.AutomationCondition.eager(),
    )
    def follows(dataset: Dataset) -> None: ...

    assets = dg.Definitions(
        assets=[LANE_ASSETS["project"], follows],
        resources={"db": DatabaseResource(), "models": ModelsResource()},
    )
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(projects_partitions.name, ["alpha", "beta"])
        first = dg.evaluate_automation_conditions(defs=assets, instance=instance)
        assert not first.get_requested_partitions(dg.AssetKey("follows"))
        instance.report_runless_asset_event(
            dg.AssetMaterialization(asset_key="dataset", partition="alpha")
        )
        second = dg.evaluate_automation_conditions(
            defs=assets, instance=instance, cursor=first.cursor
        )
    assert second.get_requested_partitions(dg.AssetKey("follows")) == {"alpha"}
