"""assets/dataset/review_formats.py: Label Studio tasks out, reviewed images back, what changed per class."""

from __future__ import annotations

import copy
import json
from xml.etree import ElementTree

import pytest

from dataminer_dagster.assets.dataset.dataset_formats import Box, DatasetContents, SplitImage
from dataminer_dagster.assets.dataset.review_formats import (
    ACCEPTED,
    CORRECTED,
    REJECTED,
    UNREVIEWED,
    ClassChanges,
    LabelledBox,
    ReviewedImage,
    ReviewImportError,
    check_fits,
    compare,
    iou,
    label_studio_config,
    label_studio_tasks,
    read_coco_export,
    read_export,
    read_label_studio_export,
    summarize_review,
)
from tests.helpers.review import as_answered

NAMES = ["person", "car"]


def contents() -> DatasetContents:
    return DatasetContents(
        images=[
            SplitImage(
                "v1_000010.png",
                "train",
                640,
                480,
                (Box(10.5, 20.25, 100.0, 50.0, 0, 0.91), Box(300.0, 200.0, 64.0, 48.0, 1, 0.4)),
                {"video_id": "v1", "frame_index": 10},
            ),
            SplitImage("v2_000003.png", "val", 333, 217, (Box(1.0, 2.0, 3.0, 4.0, 1, 0.5),)),
            SplitImage("v2_000009.png", "val", 333, 217, ()),
        ],
        names=NAMES,
        coco=None,
    )


def boxes_of(image: SplitImage) -> list[LabelledBox]:
    return [LabelledBox(b.x, b.y, b.w, b.h, NAMES[b.category]) for b in image.boxes]


def test_tasks_carry_the_stable_id_percent_boxes_and_scores():
    tasks = label_studio_tasks(contents(), lambda n: f"http://h/{n}", "dataminer v1")
    assert [t["data"]["frame"] for t in tasks] == [i.file_name for i in contents().images]
    first = tasks[0]
    assert first["data"]["image"] == "http://h/v1_000010.png"
    assert first["data"]["video_id"] == "v1" and first["data"]["split"] == "train"
    [prediction] = first["predictions"]
    assert prediction["model_version"] == "dataminer v1" and prediction["score"] == 0.4
    box = prediction["result"][0]
    assert box["original_width"] == 640 and box["original_height"] == 480
    assert box["value"]["x"] == pytest.approx(100 * 10.5 / 640)
    assert box["value"]["height"] == pytest.approx(100 * 50 / 480)
    assert box["value"]["rectanglelabels"] == ["person"] and box["score"] == 0.91
    assert tasks[2]["predictions"][0]["result"] == []
    json.dumps(tasks)  # plain JSON throughout


def test_an_unchanged_round_trip_is_the_identity():
    tasks = label_studio_tasks(contents(), str, "m")
    reviewed = read_label_studio_export(as_answered(tasks))
    assert [r.file_name for r in reviewed] == [i.file_name for i in contents().images]
    for image, answer in zip(contents().images, reviewed, strict=True):
        assert not answer.rejected
        assert len(answer.boxes) == len(image.boxes)
        for before, after in zip(boxes_of(image), answer.boxes, strict=True):
            assert iou(before, after) == pytest.approx(1.0, abs=1e-12)
            assert after.label == before.label
    predicted = {i.file_name: boxes_of(i) for i in contents().images}
    summary, states = summarize_review(
        predicted, {r.file_name: r for r in reviewed}, predicted.keys()
    )
    assert set(states.values()) == {ACCEPTED}
    assert all(c.corrections == 0 and c.rate == 0 for c in summary.classes.values())
    assert summary.classes["person"].unchanged == 1 and summary.classes["car"].unchanged == 2


def test_moved_added_deleted_relabelled_and_rejected_are_told_apart():
    tasks = as_answered(label_studio_tasks(contents(), str, "m"), skip=("v2_000009.png",))
    first = tasks[0]["annotations"][0]["result"]
    first[0]["value"]["x"] += 5.0  # 32 px to the right: moved
    first[1]["value"]["rectanglelabels"] = ["person"]  # relabelled
    added = copy.deepcopy(first[1])
    added["value"].update(x=0.0, y=0.0, rectanglelabels=["car"])
    first.append(added)
    tasks[1]["annotations"][0]["result"] = [
        {"type": "choices", "from_name": "review", "value": {"choices": ["reject"]}}
    ]
    reviewed = {r.file_name: r for r in read_label_studio_export(tasks)}
    assert reviewed["v2_000003.png"].rejected and reviewed["v2_000003.png"].boxes == ()
    assert "v2_000009.png" not in reviewed  # nobody answered it

    predicted = {i.file_name: boxes_of(i) for i in contents().images}
    summary, states = summarize_review(predicted, reviewed, predicted.keys())
    assert states == {
        "v1_000010.png": CORRECTED,
        "v2_000003.png": REJECTED,
        "v2_000009.png": UNREVIEWED,
    }
    person, car = summary.classes["person"], summary.classes["car"]
    assert (person.predicted, person.moved, person.added) == (1, 1, 0)
    assert (car.predicted, car.relabelled, car.added, car.deleted) == (1, 1, 1, 0)
    assert car.rate == pytest.approx(2 / 2) and person.rate == 1.0
    assert summary.reviewed == 2

    deleted: dict[str, ClassChanges] = {}
    assert not compare(predicted["v1_000010.png"], [], deleted)
    assert deleted["person"].deleted == 1 and deleted["car"].deleted == 1


def test_the_latest_answer_counts_and_skipped_ones_do_not():
    tasks = as_answered(label_studio_tasks(contents(), str, "m"))
    later = copy.deepcopy(tasks[0]["annotations"][0])
    later.update(id=99, result=[], updated_at="2026-12-03T11:00:00Z")
    skipped = copy.deepcopy(later)
    skipped.update(id=100, was_cancelled=True, updated_at="2026-12-03T12:00:00Z")
    tasks[0]["annotations"] += [later, skipped]
    reviewed = {r.file_name: r for r in read_label_studio_export(tasks)}
    assert reviewed["v1_000010.png"].boxes == ()


def test_a_coco_export_matches_images_by_file_name_whatever_their_ids_and_folders():
    document = {
        "images": [
            {"id": 7, "file_name": "images/v2_000009.png", "width": 333, "height": 217},
            {"id": 3, "file_name": "v1_000010.png", "width": 640, "height": 480},
        ],
        "annotations": [
            {"id": 1, "image_id": 3, "category_id": 5, "bbox": [10.5, 20.25, 100, 50]},
        ],
        "categories": [{"id": 5, "name": "person"}],
    }
    reviewed = read_coco_export(document)
    assert [(r.file_name, len(r.boxes)) for r in reviewed] == [
        ("v2_000009.png", 0),
        ("v1_000010.png", 1),
    ]
    assert reviewed[1].boxes[0] == LabelledBox(10.5, 20.25, 100.0, 50.0, "person")


def test_an_export_that_does_not_fit_is_refused_naming_the_mismatches(tmp_path):
    names = [i.file_name for i in contents().images]
    strangers = [ReviewedImage(f"other_{n}.png", False) for n in range(7)]
    with pytest.raises(
        ReviewImportError,
        match=r"7 of the export's 7 images .*other_0\.png.*"
        r"\(and 2 more\)",
    ):
        check_fits(strangers, names, NAMES)
    truck = [ReviewedImage(names[0], False, (LabelledBox(1, 1, 2, 2, "truck"),))]
    with pytest.raises(ReviewImportError, match="classes the project does not have: truck"):
        check_fits(truck, names, NAMES)
    twice = [ReviewedImage(names[0], False), ReviewedImage(names[0], True)]
    with pytest.raises(ReviewImportError, match="more than once: v1_000010.png"):
        check_fits(twice, names, NAMES)
    flat = [ReviewedImage(names[0], False, (LabelledBox(1, 1, 0, 2, "car"),))]
    with pytest.raises(ReviewImportError, match="positive finite size"):
        check_fits(flat, names, NAMES)

    (tmp_path / "notes.json").write_text('{"hello": 1}')
    with pytest.raises(ReviewImportError, match="neither a Label Studio JSON export"):
        read_export(tmp_path / "notes.json")
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(ReviewImportError, match="not a JSON file"):
        read_export(tmp_path / "broken.json")
    box = {"type": "rectanglelabels", "value": {"x": 1, "rectanglelabels": ["car"]},
           "original_width": 10, "original_height": 10}  # fmt: skip
    (tmp_path / "no_y.json").write_text(
        json.dumps([{"id": 1, "data": {"frame": "a.png"}, "annotations": [{"result": [box]}]}])
    )
    with pytest.raises(ReviewImportError, match="without a field.*KeyError: 'y'"):
        read_export(tmp_path / "no_y.json")
    with pytest.raises(ReviewImportError, match="no data.frame"):
        read_label_studio_export([{"id": 4, "data": {"image": "x.png"}, "annotations": []}])


def test_the_labelling_interface_names_every_class_and_the_reject_choice():
    classes = ["person", 'a "quoted" <class> & more']
    view = ElementTree.fromstring(label_studio_config(classes))
    assert [label.get("value") for label in view.iter("Label")] == classes
    assert [c.get("value") for c in view.iter("Choice")] == ["reject"]
    assert view.find("Image").get("value") == "$image"
    assert ElementTree.fromstring(label_studio_config(None)).find("RectangleLabels") is None
