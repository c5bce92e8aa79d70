"""assets/dataset/corrections.py: corrections kept across imports, and applied to the detector's COCO
file by the dataset build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataminer_dagster.assets.dataset.corrections import (
    apply_review,
    import_review,
    load_corrections,
    review_imports,
)
from dataminer_dagster.assets.dataset.review_formats import (
    LabelledBox,
    ReviewedImage,
    ReviewImportError,
)


def coco() -> dict:
    return {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 100, "height": 80},
            {"id": 2, "file_name": "b.jpg", "width": 100, "height": 80},
            {"id": 3, "file_name": "c.jpg", "width": 100, "height": 80},
            {"id": 4, "file_name": "d.jpg", "width": 100, "height": 80},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10], "area": 100,
             "iscrowd": 0, "score": 0.9},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [5, 5, 20, 20], "area": 400,
             "iscrowd": 0, "score": 0.8},
            {"id": 3, "image_id": 3, "category_id": 1, "bbox": [0, 0, 50, 50], "area": 2500,
             "iscrowd": 0, "score": 0.7},
        ],
        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}],
    }  # fmt: skip


def test_the_build_applies_each_answer_and_keeps_the_rest_as_it_was():
    corrections = {
        "a.jpg": ReviewedImage("a.jpg", False, (LabelledBox(1.2, 1.0, 10.0, 10.0, "cat"),)),
        "b.jpg": ReviewedImage("b.jpg", False, (LabelledBox(60, 40, 90, 90, "cat"),)),
        "c.jpg": ReviewedImage("c.jpg", True),
    }
    applied = apply_review(coco(), ["a.jpg", "b.jpg", "c.jpg", "d.jpg"], corrections)
    assert applied.states == {
        "a.jpg": "accepted",  # moved by 0.2 px: rounding, not a correction
        "b.jpg": "corrected",
        "c.jpg": "rejected",
        "d.jpg": "unreviewed",
    }
    assert applied.rejected == {"c.jpg"}
    document = applied.coco
    assert [i["file_name"] for i in document["images"]] == ["a.jpg", "b.jpg", "d.jpg"]
    first, second = document["annotations"]
    assert first == {**coco()["annotations"][0]}  # the detector's box, score and all
    # The reviewer's box, clipped to the image, with no score: a person drew it.
    assert second == {"id": 2, "image_id": 2, "category_id": 1, "bbox": [60.0, 40.0, 40.0, 40.0],
                      "area": 1600.0, "iscrowd": 0}  # fmt: skip
    dog, cat = applied.summary.classes["dog"], applied.summary.classes["cat"]
    assert (dog.predicted, dog.deleted) == (1, 1) and (cat.unchanged, cat.added) == (1, 1)

    with_unknown = {"b.jpg": ReviewedImage("b.jpg", False, (LabelledBox(1, 1, 5, 5, "horse"),))}
    applied = apply_review(coco(), ["a.jpg", "b.jpg"], with_unknown)
    assert applied.unknown_classes == ["horse"]
    assert [a["image_id"] for a in applied.coco["annotations"]] == [1, 3]

    no_boxes = apply_review(None, ["a.jpg", "c.jpg"], {"c.jpg": ReviewedImage("c.jpg", True)})
    assert no_boxes.coco is None and no_boxes.rejected == {"c.jpg"}


def test_a_later_import_takes_over_the_images_it_answers(tmp_path):
    import pandas as pd

    dataset = tmp_path / "dataset"
    dataset.mkdir()
    pd.DataFrame(
        {"file_name": ["a.jpg", "b.jpg"], "split": "train", "width": 100, "height": 80}
    ).to_parquet(dataset / "manifest.parquet")
    two = coco()
    two["images"] = two["images"][:2]
    two["annotations"] = two["annotations"][:2]
    (dataset / "annotations.coco.json").write_text(json.dumps(two))
    review = tmp_path / "review"

    def export(name: str, answers: dict[str, list]) -> Path:
        path = tmp_path / name
        path.write_text(
            json.dumps(
                [
                    {"id": n, "data": {"frame": frame}, "annotations": [{"result": result}]}
                    for n, (frame, result) in enumerate(answers.items())
                ]
            )
        )
        return path

    reject = [{"type": "choices", "value": {"choices": ["reject"]}}]
    import_review(export("first.json", {"a.jpg": reject, "b.jpg": reject}), dataset, review)
    done = import_review(export("second.json", {"b.jpg": []}), dataset, review)
    assert done.images == 1 and done.summary.states["corrected"] == 1
    kept = load_corrections(review)
    assert kept["a.jpg"].rejected and not kept["b.jpg"].rejected and kept["b.jpg"].boxes == ()
    assert [Path(i["file"]).name for i in review_imports(review)] == ["first.json", "second.json"]

    # The build then leaves the rejected a.jpg out; a later export still names it: a reviewer
    # may take the rejection back.
    pd.DataFrame({"file_name": ["b.jpg"], "split": "train", "width": 100, "height": 80}).to_parquet(
        dataset / "manifest.parquet"
    )
    one = {**two, "images": two["images"][1:], "annotations": two["annotations"][1:]}
    (dataset / "annotations.coco.json").write_text(json.dumps(one))
    again = import_review(export("again.json", {"a.jpg": [], "b.jpg": []}), dataset, review)
    assert again.summary.states["accepted"] == 1 and again.summary.states["corrected"] == 1
    assert not load_corrections(review)["a.jpg"].rejected

    before = (review / "corrections.json").read_text()
    with pytest.raises(ReviewImportError, match="not in the dataset"):
        import_review(export("third.json", {"z.jpg": []}), dataset, review)
    with pytest.raises(ReviewImportError, match="no answered image"):
        import_review(export("nobody.json", {}), dataset, review)
    assert (review / "corrections.json").read_text() == before
    assert len(review_imports(review)) == 3
