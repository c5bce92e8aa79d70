import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataminer_dagster.core.coco import (
    CocoFormatError,
    Detection,
    ImageDetections,
    build_coco,
    clip_box,
    coco_problems,
    read_coco,
    validate_coco,
    write_coco,
)

CATEGORIES = ["person", "red car", "dog"]


def sample_images() -> list[ImageDetections]:
    return [
        ImageDetections(
            "vid_b/frame_000002.jpg",
            320,
            240,
            [
                Detection(10, 20, 30, 40, 0.9, "dog"),
                Detection(300, 200, 50, 60, 0.8, "person"),  # clipped to 20 x 40
                Detection(400, 10, 10, 10, 0.7, "person"),  # entirely outside: dropped
                Detection(5, 5, 0, 10, 0.6, "dog"),  # no width: dropped
            ],
        ),
        ImageDetections(
            "vid_a/frame_000001.jpg", 640, 480, [Detection(-5, -5, 25, 15, 0.5, "red car")]
        ),
        ImageDetections("vid_c/frame_000003.jpg", 100, 100, []),
    ]


def test_ids_are_stable_and_boxes_are_clipped():
    doc = build_coco(sample_images(), CATEGORIES)

    assert [(i["id"], i["file_name"]) for i in doc["images"]] == [
        (1, "vid_a/frame_000001.jpg"),
        (2, "vid_b/frame_000002.jpg"),
        (3, "vid_c/frame_000003.jpg"),
    ]
    assert doc["categories"] == [
        {"id": 1, "name": "person", "supercategory": "object"},
        {"id": 2, "name": "red car", "supercategory": "object"},
        {"id": 3, "name": "dog", "supercategory": "object"},
    ]
    assert doc["annotations"] == [
        {"id": 1, "image_id": 1, "category_id": 2, "bbox": [0.0, 0.0, 20.0, 10.0], "area": 200.0, "iscrowd": 0, "score": 0.5},
        {"id": 2, "image_id": 2, "category_id": 3, "bbox": [10.0, 20.0, 30.0, 40.0], "area": 1200.0, "iscrowd": 0, "score": 0.9},
        {"id": 3, "image_id": 2, "category_id": 1, "bbox": [300.0, 200.0, 20.0, 40.0], "area": 800.0, "iscrowd": 0, "score": 0.8},
    ]  # fmt: skip
    assert coco_problems(doc) == []
    assert build_coco(list(reversed(sample_images())), CATEGORIES) == doc


def test_info_is_kept_and_input_order_does_not_matter():
    doc = build_coco(
        sample_images(), CATEGORIES, info={"description": "demo"}, supercategory="thing"
    )
    assert doc["info"] == {"description": "demo"}
    assert {c["supercategory"] for c in doc["categories"]} == {"thing"}


@pytest.mark.parametrize(
    "images, categories, message",
    [
        ([ImageDetections("a.jpg", 10, 10, [Detection(1, 1, 2, 2, 0.5, "cat")])], ["dog"], "'cat' on image 'a.jpg' is not a category"),
        ([ImageDetections("a.jpg", 10, 10), ImageDetections("a.jpg", 10, 10)], ["dog"], "repeated: ['a.jpg']"),
        ([], ["dog", "dog"], "repeated: ['dog']"),
        ([], [], "must not be empty"),
    ],
)  # fmt: skip
def test_build_rejects_inconsistent_input(images, categories, message):
    with pytest.raises(ValueError) as err:
        build_coco(images, categories)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "box, expected",
    [
        ((10, 10, 5, 5), (10.0, 10.0, 5.0, 5.0)),
        ((-3, 2, 10, 4), (0.0, 2.0, 7.0, 4.0)),
        ((95, 95, 10, 10), (95.0, 95.0, 5.0, 5.0)),
        ((100, 5, 4, 4), None),
        ((5, 5, -1, 4), None),
        ((1.004, 2.006, 3.0, 4.0), (1.0, 2.01, 3.0, 4.0)),
        ((float("nan"), 2, 3, 4), None),
    ],
)
def test_clip_box(box, expected):
    assert clip_box(*box, width=100, height=100) == expected


def test_written_file_loads_in_pycocotools_and_scores_perfectly_against_itself(tmp_path):
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    path = write_coco(
        build_coco(sample_images(), CATEGORIES), tmp_path / "out" / "annotations.json"
    )
    assert [p.name for p in path.parent.iterdir()] == ["annotations.json"]  # no temporary left

    ground_truth = COCO(str(path))
    assert len(ground_truth.getImgIds()) == 3
    assert ground_truth.getCatIds(catNms=["red car"]) == [2]
    assert len(ground_truth.getAnnIds(imgIds=[2])) == 2

    results = ground_truth.loadRes(json.loads(path.read_text())["annotations"])
    evaluation = COCOeval(ground_truth, results, "bbox")
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    assert evaluation.stats[0] == pytest.approx(1.0)  # AP@[.5:.95]
    assert read_coco(path) == json.loads(path.read_text())


def test_rewrite_replaces_the_file(tmp_path):
    path = tmp_path / "annotations.json"
    write_coco(build_coco(sample_images(), CATEGORIES), path)
    write_coco(build_coco(sample_images()[:1], CATEGORIES), path)
    assert len(read_coco(path)["images"]) == 1


def _valid() -> dict:
    return build_coco(sample_images(), CATEGORIES)


def _break(edit):
    doc = copy.deepcopy(_valid())
    edit(doc)
    return doc


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("images"), "'images' must be a list, got nothing"),
        (lambda d: d.__setitem__("annotations", {}), "'annotations' must be a list, got dict"),
        (lambda d: d.__setitem__("categories", []), "'categories' is empty"),
        (lambda d: d["images"][1].__setitem__("id", 1), "images[1].id 1 is used by another image"),
        (lambda d: d["images"][0].__setitem__("id", "1"), "images[0].id must be an integer, got '1'"),
        (lambda d: d["images"][0].__setitem__("id", True), "images[0].id must be an integer, got True"),
        (lambda d: d["images"][2].__setitem__("file_name", d["images"][0]["file_name"]), "is listed twice"),
        (lambda d: d["images"][0].__setitem__("width", 0), "images[0].width must be a positive integer, got 0"),
        (lambda d: d["images"][0].pop("height"), "images[0].height must be a positive integer, got None"),
        (lambda d: d["images"].append(7), "images[3] must be an object, got int"),
        (lambda d: d["categories"][1].__setitem__("id", 1), "categories[1].id 1 is used by another category"),
        (lambda d: d["categories"][1].__setitem__("name", "person"), "categories[1].name 'person' is used"),
        (lambda d: d["categories"][0].pop("supercategory"), "categories[0].supercategory must be a string"),
        (lambda d: d["annotations"][1].__setitem__("id", 1), "annotations[1].id 1 is used by another annotation"),
        (lambda d: d["annotations"][0].__setitem__("image_id", 99), "annotations[0].image_id 99 does not name"),
        (lambda d: d["annotations"][0].__setitem__("category_id", 9), "annotations[0].category_id 9 does not name"),
        (lambda d: d["annotations"][0].__setitem__("bbox", [1, 2, 3]), "annotations[0].bbox must be [x, y, width, height]"),
        (lambda d: d["annotations"][0].__setitem__("bbox", [1, 2, 3, float("nan")]), "must be [x, y, width, height]"),
        (lambda d: d["annotations"][0].__setitem__("bbox", [1, 2, 0, 4]), "has no area"),
        (lambda d: d["annotations"][1].__setitem__("bbox", [300, 200, 30, 40]), "leaves its 320x240 image"),
        (lambda d: d["annotations"][1].__setitem__("bbox", [-1, 0, 3, 4]), "leaves its 320x240 image"),
        (lambda d: d["annotations"][0].__setitem__("area", 0), "annotations[0].area must be a positive number"),
        (lambda d: d["annotations"][0].__setitem__("iscrowd", 2), "annotations[0].iscrowd must be 0 or 1"),
        (lambda d: d["annotations"][0].__setitem__("score", 1.5), "annotations[0].score must be a number in [0, 1]"),
    ],
)  # fmt: skip
def test_validation_names_each_problem(edit, message):
    doc = _break(edit)
    problems = coco_problems(doc)
    assert any(message in p for p in problems), problems
    with pytest.raises(CocoFormatError) as err:
        validate_coco(doc, source="annotations.json")
    assert "in annotations.json" in str(err.value) and message in str(err.value)


def test_validation_of_non_objects_and_long_reports():
    assert coco_problems([]) == ["the document must be a JSON object, got list"]
    doc = _valid()
    for annotation in doc["annotations"]:
        annotation["image_id"] = 42
    doc["annotations"] *= 10
    with pytest.raises(CocoFormatError) as err:
        validate_coco(doc)
    assert len(err.value.problems) > 20 and "... and " in str(err.value)


def test_write_refuses_an_invalid_document(tmp_path):
    doc = _break(lambda d: d["annotations"][0].__setitem__("category_id", 9))
    with pytest.raises(CocoFormatError):
        write_coco(doc, tmp_path / "bad.json")
    assert list(tmp_path.iterdir()) == []


boxes = st.tuples(
    st.floats(-500, 1500, allow_nan=False),
    st.floats(-500, 1500, allow_nan=False),
    st.floats(-10, 800, allow_nan=False),
    st.floats(-10, 800, allow_nan=False),
    st.floats(0, 1),
    st.sampled_from(CATEGORIES),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 1000), st.integers(1, 1000), st.lists(boxes, max_size=6)),
        max_size=5,
    )
)
def test_any_detections_make_a_valid_document(raw):
    images = [
        ImageDetections(f"frame_{i:03d}.jpg", w, h, [Detection(*b) for b in dets])
        for i, (w, h, dets) in enumerate(raw)
    ]
    doc = build_coco(images, CATEGORIES)
    assert coco_problems(doc) == []
    for annotation in doc["annotations"]:
        image = doc["images"][annotation["image_id"] - 1]
        x, y, w, h = annotation["bbox"]
        assert x >= 0 and y >= 0 and w > 0 and h > 0
        assert x + w <= image["width"] + 0.01 and y + h <= image["height"] + 0.01
