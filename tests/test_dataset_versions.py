"""Dataset versions: each build whose content changed is kept as a new, numbered version beside
the dataset, the earlier ones stay readable, and `dataminer dataset diff` says what changed."""

from __future__ import annotations

import json

import pandas as pd
from click.testing import CliRunner

from dataminer_dagster.assets.dataset.dataset_files import IMAGES_DIR, MANIFEST_FILE, VERSION_FILE
from dataminer_dagster.assets.dataset.dataset_versions import diff_versions, list_versions
from dataminer_dagster.cli import main
from tests.helpers.project_runs import dataminer, redone
from tests.helpers.review import use_changing_data


def test_a_changed_dataset_is_a_new_version_and_the_old_one_stays_readable(
    changing, database_url, tmp_path, monkeypatch
):
    changing.register(dataset={"formats": ["coco"]})
    before = changing.run()
    versions_dir = changing.output.dataset_versions_dir
    [first] = list_versions(versions_dir)
    assert first.number == 1 and first.images == len(changing.manifest())
    shipped = json.loads((changing.output.dataset_dir / VERSION_FILE).read_text())
    assert shipped["version"] == 1 and shipped["content_hash"] == first.content_hash
    assert set(first.produced_by["fingerprints"]) >= {"filter", "dedup", "detect", "dataset"}
    assert first.produced_by["detector"].startswith("yolo ")

    # The dataset is made again with the same content (another format): the same version.
    changing.register(dataset={"formats": ["coco", "hf"]})
    assert redone(before, changing.run()) == {"dataset": 1}
    assert [v.number for v in list_versions(versions_dir)] == [1]
    assert json.loads((changing.output.dataset_dir / VERSION_FILE).read_text())["version"] == 1

    # Another detector confidence changes the boxes: version 2, version 1 kept as it was.
    v1 = versions_dir / "v1"
    v1_manifest = pd.read_parquet(v1 / MANIFEST_FILE)
    changing.register(detect={"confidence": 0.5})
    changing.run()
    assert [v.number for v in list_versions(versions_dir)] == [1, 2]
    pd.testing.assert_frame_equal(pd.read_parquet(v1 / MANIFEST_FILE), v1_manifest)
    assert sorted(p.name for p in (v1 / IMAGES_DIR).iterdir()) == sorted(v1_manifest["file_name"])
    diff = diff_versions(versions_dir, 1, 2)
    assert diff.added == diff.removed == [] and diff.relabelled, diff
    assert len(diff.relabelled) <= len(v1_manifest)

    use_changing_data(database_url, tmp_path, monkeypatch)
    listed = dataminer("dataset", "versions", "changing")
    assert listed.startswith("v1  ") and "\nv2  " in listed
    said = dataminer("dataset", "diff", "changing")
    assert said.splitlines()[0] == "dataset v1 -> v2:"
    assert f"  {len(diff.relabelled)} relabelled: {diff.relabelled[0]}" in said
    assert "  0 added" in said and "  0 removed" in said
    dataminer("export", "changing", str(tmp_path / "exported"), "--link")
    assert json.loads((tmp_path / "exported" / VERSION_FILE).read_text())["version"] == 2


def test_a_version_that_does_not_exist_is_named_with_the_ones_kept(
    changing, database_url, tmp_path, monkeypatch
):
    changing.run()
    use_changing_data(database_url, tmp_path, monkeypatch)
    result = CliRunner().invoke(main, ["dataset", "diff", "changing", "--from", "1", "--to", "7"])
    assert result.exit_code != 0
    assert "no dataset version v7 (versions kept: v1)" in result.output
    assert "Traceback" not in result.output
