"""The review round trip through `dataminer review export` and `dataminer review import`: an
unchanged review is the identity, corrections make a new dataset version (rejected images out,
the reviewer's boxes in, the review state in the manifest, the correction rate in the report),
and an export of other images changes nothing. Against a real Label Studio server:
tests/test_label_studio.py."""

from __future__ import annotations

import json

import dagster as dg
import pandas as pd
import pytest
from click.testing import CliRunner

from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, MANIFEST_FILE
from dataminer_dagster.assets.dataset.dataset_versions import diff_versions, list_versions
from dataminer_dagster.cli import main
from tests.helpers.project_runs import dataminer
from tests.helpers.review import as_answered, boxes, use_changing_data


@pytest.fixture
def changing(changing_shared):
    """`dataminer review import` rebuilds the dataset through an instance of its own (from
    DAGSTER_HOME), whose run the tests read."""
    return changing_shared


def test_a_review_comes_back_as_corrections_and_a_new_version(
    changing, database_url, tmp_path, monkeypatch
):
    changing.run()
    use_changing_data(database_url, tmp_path, monkeypatch)
    dataset = changing.output.dataset_dir
    v1_coco = json.loads((dataset / COCO_FILE).read_text())
    said = dataminer(
        "review", "export", "changing", str(tmp_path / "for_review"), "--image-url", "http://h/i"
    )
    tasks = json.loads((tmp_path / "for_review" / "tasks.json").read_text())
    manifest = changing.manifest()
    assert [t["data"]["frame"] for t in tasks] == list(manifest["file_name"])
    assert tasks[0]["data"]["image"] == f"http://h/i/{manifest['file_name'][0]}"
    assert f"{len(tasks)} images with {len(v1_coco['annotations'])} boxes" in said
    assert (tmp_path / "for_review" / "labeling.xml").read_text().startswith("<View>")
    assert json.loads((tmp_path / "for_review" / "annotations.coco.json").read_text()) == v1_coco

    # Every prediction accepted as it was: the same dataset, each image accepted.
    (tmp_path / "accepted.json").write_text(json.dumps(as_answered(tasks)))
    said = dataminer("review", "import", "changing", str(tmp_path / "accepted.json"), "--no-wait")
    assert (
        f"imported the review of {len(tasks)} images (label-studio): {len(tasks)} accepted" in said
    )
    changing.run()
    assert [v.number for v in list_versions(changing.output.dataset_versions_dir)] == [1]
    assert boxes(json.loads((dataset / COCO_FILE).read_text())) == boxes(v1_coco)
    assert set(changing.manifest()["review"]) == {"accepted"}

    # Corrections: a box moved, the boxes of an image deleted, one added, an image rejected.
    with_boxes = [t for t in tasks if t["predictions"][0]["result"]]
    assert len(with_boxes) >= 4, "the tiny detector at confidence 0.01 finds boxes everywhere"
    moved, emptied, added, rejected = (t["data"]["frame"] for t in with_boxes[:4])
    answers = {t["data"]["frame"]: t for t in as_answered(with_boxes[:4])}
    answers[moved]["annotations"][0]["result"][0]["value"]["x"] += 10.0
    answers[emptied]["annotations"][0]["result"] = []
    extra = json.loads(json.dumps(answers[added]["annotations"][0]["result"][0]))
    extra["value"].update(x=1.0, y=1.0, width=20.0, height=20.0)
    answers[added]["annotations"][0]["result"].append(extra)
    answers[rejected]["annotations"][0]["result"] = [
        {
            "type": "choices",
            "from_name": "review",
            "to_name": "image",
            "value": {"choices": ["reject"]},
        }
    ]
    (tmp_path / "corrected.json").write_text(json.dumps(list(answers.values())))
    said = dataminer("review", "import", "changing", str(tmp_path / "corrected.json"))
    assert "0 accepted, 3 corrected, 1 rejected" in said and "dataset of changing is v2" in said

    versions_dir = changing.output.dataset_versions_dir
    assert [v.number for v in list_versions(versions_dir)] == [1, 2]
    diff = diff_versions(versions_dir, 1, 2)
    assert diff.removed == [rejected] and diff.added == []
    assert sorted(diff.relabelled) == sorted([moved, emptied, added])
    after = changing.manifest().set_index("file_name")
    assert rejected not in after.index
    assert after.loc[emptied, "detections"] == 0
    assert after.loc[[moved, emptied, added], "review"].tolist() == ["corrected"] * 3
    # The first import's answers stay: the other images are still accepted.
    assert set(after.drop(index=[moved, emptied, added])["review"]) == {"accepted"}
    coco = boxes(json.loads((dataset / COCO_FILE).read_text()))
    before = boxes(v1_coco)
    assert coco[emptied] == [] and rejected not in coco
    assert len(coco[added]) == len(before[added]) + 1
    assert coco[moved][0][1][0] != before[moved][0][1][0] and coco[moved][0][2] is None
    untouched = set(coco) - {moved, emptied, added}
    assert all(coco[n] == before[n] for n in untouched)  # scores and all
    report = (dataset / "report.md").read_text()
    assert "## Review" in report and "correction rate" in report
    [latest] = changing.instance.fetch_materializations(
        dg.AssetKey("dataset"), limit=1, ascending=False
    ).records
    shown = latest.asset_materialization.metadata
    assert shown["review_corrected"].value == 3 and shown["review_rejected"].value == 1
    per_class = shown["review_per_class"].value.records  # the UI's table
    assert sum(r.data["deleted"] for r in per_class) >= 1
    assert sum(r.data["added"] for r in per_class) == 1
    version = json.loads((versions_dir / "v2" / "version.json").read_text())
    assert [i["images"] for i in version["produced_by"]["review_imports"]] == [len(tasks), 4]
    pd.testing.assert_frame_equal(
        pd.read_parquet(versions_dir / "v1" / MANIFEST_FILE), manifest, check_like=True
    )


def test_a_cvat_coco_export_comes_back_and_an_export_of_other_images_changes_nothing(
    changing, database_url, tmp_path, monkeypatch
):
    changing.run()
    use_changing_data(database_url, tmp_path, monkeypatch)
    dataminer("review", "export", "changing", str(tmp_path / "for_review"))
    tasks = json.loads((tmp_path / "for_review" / "tasks.json").read_text())
    assert tasks[0]["data"]["image"].startswith("/data/local-files/?d=")
    answered = as_answered(tasks)
    for task in answered[:2]:
        task["data"]["frame"] = "elsewhere_" + task["data"]["frame"]
    (tmp_path / "mixed.json").write_text(json.dumps(answered))
    result = CliRunner().invoke(
        main, ["review", "import", "changing", str(tmp_path / "mixed.json")]
    )
    assert result.exit_code == 1
    assert "2 of the export's" in result.output and "elsewhere_" in result.output
    assert "nothing was imported" in result.output and "Traceback" not in result.output
    assert not changing.output.review_dir.exists()

    # CVAT's "COCO 1.0" export of a task made from the COCO file: its own ids, a folder in the
    # file names, and the boxes of one image deleted by the reviewer.
    coco = json.loads((tmp_path / "for_review" / "annotations.coco.json").read_text())
    emptied = next(
        i for i in coco["images"] if any(a["image_id"] == i["id"] for a in coco["annotations"])
    )
    renumbered = {i["id"]: 100 + n for n, i in enumerate(reversed(coco["images"]))}
    cvat = {
        "images": [
            {**i, "id": renumbered[i["id"]], "file_name": f"images/{i['file_name']}"}
            for i in coco["images"]
        ],
        "annotations": [
            {**a, "image_id": renumbered[a["image_id"]], "category_id": a["category_id"] + 1}
            for a in coco["annotations"]
            if a["image_id"] != emptied["id"]
        ],
        "categories": [{**c, "id": c["id"] + 1} for c in coco["categories"]],
    }
    (tmp_path / "cvat.json").write_text(json.dumps(cvat))
    said = dataminer("review", "import", "changing", str(tmp_path / "cvat.json"), "--no-wait")
    assert f"(coco): {len(coco['images']) - 1} accepted, 1 corrected, 0 rejected" in said
    changing.run()
    after = changing.manifest().set_index("file_name")
    assert after.loc[emptied["file_name"], "review"] == "corrected"
    assert after.loc[emptied["file_name"], "detections"] == 0
    assert (after.drop(index=emptied["file_name"])["review"] == "accepted").all()
    diff = diff_versions(changing.output.dataset_versions_dir, 1, 2)
    assert diff.relabelled == [emptied["file_name"]] and diff.removed == []
