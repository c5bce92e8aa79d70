"""A project driven to its dataset as `dataminer run` drives it: the images split by source, every
training format written per split and read back by the tools that use them, the quality report,
and the dataset's checks as Dagster records them (the hard ones blocking, of severity ERROR)."""

from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml

from dataminer_dagster.assets.dataset.dataset_splits import SPLITS
from dataminer_dagster.outputs import load_output
from dataminer_dagster.partitions import projects_partitions
from tests.helpers.pipeline import materialize_partitions
from tests.helpers.stages import STAGES

pytestmark = pytest.mark.slow

HARD = ("dataset_complete", "splits_complete", "no_pairs_across_splits", "provenance_complete")
SOFT = ("splits_filled", "image_quality")


def _checks(instance: dg.DagsterInstance) -> dict[str, dg.AssetCheckEvaluation]:
    """The latest evaluation of each of the dataset's checks."""
    keys = [dg.AssetCheckKey(dg.AssetKey("dataset"), name) for name in HARD + SOFT]
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(keys)
    return {key.name: record.event.asset_check_evaluation for key, record in latest.items()}


def test_the_dataset_has_every_format_per_split_and_a_report(changing):
    changing.register(
        inputs={"files": changing.clips},
        dataset={
            "formats": ["coco", "yolo", "hf"],
            "splits": {"train": 0.34, "val": 0.33, "test": 0.33},
            "seed": 3,
        },
        dedup={"threshold": 0.9999},
    )
    changing.run()
    root = changing.output.dataset_dir
    manifest = changing.manifest()
    assert set(manifest["split"]) <= set(SPLITS) and manifest["split"].notna().all()
    assert (manifest.groupby("video_id")["split"].nunique() == 1).all()
    per_split = manifest["split"].value_counts().to_dict()
    # three clips, no near-duplicate across them at 0.9999 (at 0.99 the tiny random model finds
    # two of the clips alike): three units, one per split
    assert set(per_split) == set(SPLITS) and manifest["video_id"].nunique() == 3
    assert manifest["brightness"].between(0, 255).all()
    for video in manifest["video_id"].unique():  # measured at extraction, not from the file
        assert pd.read_parquet(changing.output.filter_table(video))["brightness"].notna().all()

    checks = _checks(changing.instance)
    for name in HARD:
        assert checks[name].passed, (name, checks[name].description)
        assert checks[name].severity == dg.AssetCheckSeverity.ERROR and checks[name].blocking
    for name in SOFT:
        assert checks[name].severity == dg.AssetCheckSeverity.WARN and not checks[name].blocking
    assert checks["no_pairs_across_splits"].metadata["pairs_across_splits"].value == 0

    # COCO per split, in pycocotools
    from pycocotools.coco import COCO

    for split, n in per_split.items():
        coco = COCO(str(root / "coco" / f"{split}.json"))
        assert len(coco.getImgIds()) == n
        assert {i["file_name"] for i in coco.loadImgs(coco.getImgIds())} == set(
            manifest.loc[manifest["split"] == split, "file_name"]
        )

    # YOLO: a label file per image, as many boxes as the detections
    for split, n in per_split.items():
        assert len(list((root / "yolo" / "images" / split).iterdir())) == n
        assert len(list((root / "yolo" / "labels" / split).glob("*.txt"))) == n
    boxes = sum(len(p.read_text().splitlines()) for p in (root / "yolo" / "labels").rglob("*.txt"))
    assert boxes == manifest["detections"].sum()
    data = yaml.safe_load((root / "yolo" / "data.yaml").read_text())
    assert data["path"] == str(root / "yolo") and data["names"][0] == "person"
    assert [data[s] for s in SPLITS] == ["images/train", "images/val", "images/test"]

    # Hugging Face imagefolder, in datasets
    import datasets

    loaded = datasets.load_dataset("imagefolder", data_dir=str(root / "hf"))
    names = {"train": "train", "val": "validation", "test": "test"}
    assert {k: len(v) for k, v in loaded.items()} == {names[s]: n for s, n in per_split.items()}
    coco_all = json.loads((root / "annotations.coco.json").read_text())
    boxes_of = {}
    file_of = {i["id"]: i["file_name"] for i in coco_all["images"]}
    for a in coco_all["annotations"]:
        boxes_of.setdefault(file_of[a["image_id"]], []).append(a["bbox"])
    for split in loaded.values():
        for row in split:
            name = f"{row['video_id']}_{row['frame_index']:06d}.jpg"
            assert row["objects"]["bbox"] == boxes_of.get(name, [])
            assert row["source_url"] in changing.clips

    # the quality report
    report = (root / "report.md").read_text()
    assert "| near-duplicate pairs across splits (must be 0) | 0 |" in report
    assert f"{len(manifest)} of {len(manifest)} images have a source URL or path." in report
    assert sorted(p.name for p in (root / "report").iterdir()) == [
        "classes.png",
        "quality.png",
        "scores.png",
        "splits.png",
        "videos.png",
    ]

    # what a downstream asset loads
    project = changing.catalog.projects.get("changing")
    value = load_output("dataset", "changing", project.output_dir)
    assert value.splits == {s: per_split.get(s, 0) for s in SPLITS}
    assert value.hf_dir == root / "hf" and value.report_path == root / "report.md"
    assert set(value.coco_splits) == set(per_split)
    assert len(value.read_split("train")) == per_split.get("train", 0)


def test_a_broken_hard_rule_fails_the_run_and_a_soft_one_only_warns(changing):
    """Two videos for three splits: `splits_filled` warns and the run goes on. Videos whose
    recorded source is blank (the catalog requires a URL or a path, not that it says anything):
    `provenance_complete` fails, and being blocking, fails the run."""
    changing.run()
    checks = _checks(changing.instance)
    assert not checks["splits_filled"].passed
    assert "empty although given a share" in checks["splits_filled"].description
    assert "dataset.splits" in (changing.output.dataset_dir / "report.md").read_text()

    with changing.engine.begin() as c:
        c.execute(sa.text("UPDATE dataminer.videos SET source_path = ' '"))
    result = materialize_partitions(
        [STAGES["dataset"]],
        ["changing"],
        instance=changing.instance,
        resources=changing.resources,
        partitions=projects_partitions,
        raise_on_error=False,
        redo=True,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "blocking asset check failed with ERROR severity" in str(failure.event_specific_data)
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    provenance = evaluations["provenance_complete"]
    assert not provenance.passed and provenance.severity == dg.AssetCheckSeverity.ERROR
    assert provenance.metadata["without_source"].value == len(changing.manifest())
    assert evaluations["dataset_complete"].passed and evaluations["splits_complete"].passed
    assert (changing.manifest()["source_url"] == " ").all()
