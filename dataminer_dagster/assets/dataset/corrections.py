"""A project's review: the corrections people made to its dataset in a labelling tool, kept in
`<output>/review/` and applied by every build of the dataset after them.

    review/corrections.json  file name -> {rejected, boxes}: each reviewed image's latest answer
    review/imports.jsonl     one line per import: when, from which file (its SHA-256), the
                             format, how many images

An import (`import_review`) checks the export against the published dataset first (its images
and classes; assets/dataset/review_formats.py) and changes nothing when it does not fit; an image answered again
by a later import takes the later answer. The dataset stage then (`apply_review`) leaves rejected
images out, gives corrected images the reviewer's boxes (without a score: a person drew them)
and keeps the detector's boxes, scores and all, where the reviewer changed nothing; every
image's state is a manifest column, and the changes per class are in the quality report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dataminer_dagster.assets.dataset.dataset_files import MANIFEST_FILE
from dataminer_dagster.assets.dataset.dataset_formats import read_contents
from dataminer_dagster.assets.dataset.review_formats import (
    CORRECTED,
    REJECTED,
    LabelledBox,
    ReviewedImage,
    ReviewImportError,
    ReviewSummary,
    check_fits,
    read_export,
    summarize_review,
)
from dataminer_dagster.core.coco import BOX_DECIMALS, clip_box
from dataminer_dagster.core.files import write_atomically

CORRECTIONS_FILE = "corrections.json"
IMPORTS_FILE = "imports.jsonl"


def load_corrections(review_dir: Path) -> dict[str, ReviewedImage]:
    """Each reviewed image's latest answer; empty before the first import."""
    path = review_dir / CORRECTIONS_FILE
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text(encoding="utf-8"))
    return {name: ReviewedImage.from_json(name, answer) for name, answer in raw.items()}


def review_imports(review_dir: Path) -> list[dict[str, Any]]:
    """The imports so far, oldest first."""
    path = review_dir / IMPORTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


@dataclass(frozen=True)
class ImportDone:
    format: str
    images: int  # reviewed images in the export
    summary: ReviewSummary  # against the dataset's boxes as published


def import_review(export: Path, dataset_dir: Path, review_dir: Path) -> ImportDone:
    """Read a labelling tool's export of the dataset in `dataset_dir` and keep its answers in
    `review_dir`. Raises ReviewImportError, having changed nothing, when it does not fit."""
    if not (dataset_dir / MANIFEST_FILE).is_file():
        raise ReviewImportError("the project has no dataset yet: make it, export it, review it")
    fmt, reviewed = read_export(export)
    if not reviewed:
        raise ReviewImportError(
            f"{export}: no answered image in it (tasks nobody annotated, or skipped, are not "
            "reviewed)"
        )
    contents = read_contents(dataset_dir)
    earlier = load_corrections(review_dir)
    # An image rejected earlier has left the dataset, not the review: it may be answered again.
    check_fits(reviewed, [*(i.file_name for i in contents.images), *earlier], contents.names)
    names = contents.names or []
    published = {
        image.file_name: [LabelledBox(b.x, b.y, b.w, b.h, names[b.category]) for b in image.boxes]
        for image in contents.images
    }
    answers = {r.file_name: r for r in reviewed}
    summary, _ = summarize_review(published, answers, answers)
    corrections = {**earlier, **answers}
    record = {
        "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "file": str(export),
        "sha256": hashlib.sha256(export.read_bytes()).hexdigest(),
        "format": fmt,
        "images": len(reviewed),
        "states": dict(summary.states),
    }
    review_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(
        review_dir / CORRECTIONS_FILE,
        json.dumps({name: c.as_json() for name, c in sorted(corrections.items())}, indent=1),
    )
    with open(review_dir / IMPORTS_FILE, "a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")
    return ImportDone(fmt, len(reviewed), summary)


@dataclass(frozen=True)
class AppliedReview:
    coco: dict[str, Any] | None  # the dataset's annotations after the review
    states: dict[str, str]  # file name -> review state, for every image before rejections
    rejected: set[str]
    summary: ReviewSummary
    unknown_classes: list[str] = field(default_factory=list)  # of corrected boxes left out


def apply_review(
    coco: Mapping[str, Any] | None,
    file_names: Iterable[str],
    corrections: Mapping[str, ReviewedImage],
) -> AppliedReview:
    """The detector's annotations (`coco`) of the images `file_names` with the corrections
    applied: rejected images out, corrected ones with the reviewer's boxes."""
    predicted = _boxes_by_file(coco) if coco is not None else {}
    summary, states = summarize_review(predicted, corrections, file_names)
    rejected = {name for name, state in states.items() if state == REJECTED}
    if coco is None:  # no detect section (any more): boxes have nowhere to go
        drawn = {b.label for n, s in states.items() if s == CORRECTED for b in corrections[n].boxes}
        return AppliedReview(None, states, rejected, summary, sorted(drawn))
    category_id = {c["name"]: c["id"] for c in coco["categories"]}
    images = [i for i in coco["images"] if i["file_name"] not in rejected]
    kept_ids = {i["id"] for i in images}
    replaced = {i["id"]: i for i in images if states.get(i["file_name"]) == CORRECTED}
    annotations = [
        a
        for a in coco["annotations"]
        if a["image_id"] in kept_ids and a["image_id"] not in replaced
    ]
    unknown: set[str] = set()
    for image_id, image in replaced.items():
        for box in corrections[image["file_name"]].boxes:
            if box.label not in category_id:  # a class the detect section no longer has
                unknown.add(box.label)
                continue
            clipped = clip_box(box.x, box.y, box.w, box.h, image["width"], image["height"])
            if clipped is not None:
                annotations.append(
                    {
                        "image_id": image_id,
                        "category_id": category_id[box.label],
                        "bbox": list(clipped),
                        "area": round(clipped[2] * clipped[3], BOX_DECIMALS),
                        "iscrowd": 0,
                    }
                )
    annotations.sort(key=lambda a: a["image_id"])  # image order, then each image's own order
    annotations = [{**a, "id": n} for n, a in enumerate(annotations, start=1)]
    return AppliedReview(
        {**coco, "images": images, "annotations": annotations},
        states,
        rejected,
        summary,
        sorted(unknown),
    )


def _boxes_by_file(coco: Mapping[str, Any]) -> dict[str, list[LabelledBox]]:
    names = {c["id"]: c["name"] for c in coco["categories"]}
    file_of = {i["id"]: i["file_name"] for i in coco["images"]}
    boxes: dict[str, list[LabelledBox]] = {name: [] for name in file_of.values()}
    for a in coco["annotations"]:
        boxes[file_of[a["image_id"]]].append(LabelledBox(*a["bbox"], names[a["category_id"]]))
    return boxes
