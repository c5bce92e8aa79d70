"""The README's main command: `dataminer demo` finishes offline and writes a valid dataset."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from dataminer_dagster.cli import main
from dataminer_dagster.core.coco import validate_coco

pytestmark = pytest.mark.slow


def test_demo_writes_a_valid_dataset(dataminer_env, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(dataminer_env.parent)  # no yolo11n.pt here: the tiny detector is used
    result = CliRunner().invoke(main, ["demo", "--videos", "3", "--port", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "TINY RANDOM-WEIGHT" in result.output, "the demo says plainly when models are random"
    assert "project demo: complete" in result.output

    dataset = dataminer_env / "data" / "projects" / "demo" / "dataset"
    manifest = pd.read_parquet(dataset / "manifest.parquet")
    assert len(manifest) >= 1
    assert all((dataset / "images" / name).is_file() for name in manifest["file_name"])
    coco = json.loads((dataset / "annotations.coco.json").read_text())
    validate_coco(coco)
    assert {image["file_name"] for image in coco["images"]} == set(manifest["file_name"])
    assert manifest["source_url"].str.startswith("http://127.0.0.1:").all(), (
        "videos went through yt-dlp"
    )
    # shipped in every format, with its report; the tiny models' frames are all near-duplicates
    # of each other, so every video is in one source unit, train, and the report says so
    assert "report.md" in result.output
    assert set(manifest["split"]) == {"train"}
    assert len(json.loads((dataset / "coco" / "train.json").read_text())["images"]) == len(manifest)
    assert len(list((dataset / "yolo" / "labels" / "train").iterdir())) == len(manifest)
    assert len((dataset / "hf" / "train" / "metadata.jsonl").read_text().splitlines()) == len(
        manifest
    )
    assert "the val and test splits are empty" in (dataset / "report.md").read_text()
