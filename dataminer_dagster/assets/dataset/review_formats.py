"""Review of a dataset in a labelling tool, and back: the corrections a person made.

Out: every image of the dataset as a Label Studio task (`label_studio_tasks`) with its boxes as
predictions (percent coordinates, `original_width`/`original_height`, score, model version) and
the image's file name in `data.frame`, the stable id that brings the answer back to the image
(a frame's file name is its video and frame index: the same in every build); and the labelling
interface that goes with them (`label_studio_config`): the project's classes as rectangle
labels, and a "reject" choice for an image that should not be in the dataset.

Back: Label Studio's JSON export (each task's latest annotation that was not skipped) or a COCO
file (CVAT's "COCO 1.0" export: every image it lists counts as reviewed) becomes one
`ReviewedImage` per image: rejected, or the boxes the reviewer left. Images are matched by the
stable id, never by position; an export naming images the dataset does not have, or classes the
project does not have, is refused whole (`ReviewImportError`, naming the first mismatches).

`compare` sets the reviewer's boxes against the boxes the image had: each box unchanged, moved,
relabelled, deleted or added, per class, from which the report's correction rate comes.

Pure Python: no Dagster, no SQL, no HTTP (the Label Studio client is assets/dataset/label_studio.py).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from xml.sax.saxutils import quoteattr

from dataminer_dagster.assets.dataset.dataset_formats import DatasetContents
from dataminer_dagster.core.coco import box_iou
from dataminer_dagster.core.label_studio_export import task_answer

# The names of the labelling interface's parts, which the export's results refer to.
IMAGE_FIELD = "image"  # data.image: where the tool loads the picture from
FRAME_FIELD = "frame"  # data.frame: the image's file name in the dataset, its stable id
BOXES_CONTROL = "label"
REVIEW_CONTROL = "review"
REJECT = "reject"

UNREVIEWED, ACCEPTED, CORRECTED, REJECTED = "unreviewed", "accepted", "corrected", "rejected"
REVIEW_STATES = (UNREVIEWED, ACCEPTED, CORRECTED, REJECTED)

# A box the reviewer did not change comes back through percent coordinates with rounding noise;
# a move smaller than this, on every edge, is no move.
SAME_BOX_PIXELS = 0.5
# Two boxes are the same object (perhaps moved or relabelled) from this overlap on.
SAME_OBJECT_IOU = 0.5
MISMATCHES_SHOWN = 5


class ReviewImportError(ValueError):
    """An export that does not fit the dataset; nothing of it was imported."""


@dataclass(frozen=True)
class LabelledBox:
    """A box in pixels (top-left corner and size, as COCO) and its class name."""

    x: float
    y: float
    w: float
    h: float
    label: str

    @property
    def edges(self) -> tuple[float, float, float, float]:
        return (self.x, self.y, self.x + self.w, self.y + self.h)


@dataclass(frozen=True)
class ReviewedImage:
    file_name: str
    rejected: bool
    boxes: tuple[LabelledBox, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "rejected": self.rejected,
            "boxes": [[b.x, b.y, b.w, b.h, b.label] for b in self.boxes],
        }

    @classmethod
    def from_json(cls, file_name: str, raw: Mapping[str, Any]) -> ReviewedImage:
        return cls(
            file_name,
            bool(raw["rejected"]),
            tuple(LabelledBox(x, y, w, h, label) for x, y, w, h, label in raw["boxes"]),
        )


# -- out: tasks and the labelling interface ---------------------------------------------------


def label_studio_config(names: Sequence[str] | None) -> str:
    """The labelling interface: the image, its classes as rectangle labels (none without a
    detect section) and the reject choice."""
    labels = "".join(f"\n    <Label value={quoteattr(n)}/>" for n in names or [])
    boxes = (
        f'\n  <RectangleLabels name="{BOXES_CONTROL}" toName="{IMAGE_FIELD}">{labels}\n'
        "  </RectangleLabels>"
        if names
        else ""
    )
    return (
        "<View>\n"
        f'  <Image name="{IMAGE_FIELD}" value="${IMAGE_FIELD}"/>{boxes}\n'
        f'  <Choices name="{REVIEW_CONTROL}" toName="{IMAGE_FIELD}" choice="single">\n'
        f'    <Choice value="{REJECT}"/>\n'
        "  </Choices>\n"
        "</View>\n"
    )


def label_studio_tasks(
    contents: DatasetContents, image_url: Callable[[str], str], model_version: str
) -> list[dict[str, Any]]:
    """One task per image of the dataset, in its order, with the image's boxes as one
    prediction. `image_url(file_name)` says where the tool loads the image from."""
    names = contents.names or []
    tasks = []
    for image in contents.images:
        results = [
            {
                "id": f"{image.file_name}#{i}",
                "from_name": BOXES_CONTROL,
                "to_name": IMAGE_FIELD,
                "type": "rectanglelabels",
                "original_width": image.width,
                "original_height": image.height,
                "image_rotation": 0,
                "value": {
                    "x": 100.0 * box.x / image.width,
                    "y": 100.0 * box.y / image.height,
                    "width": 100.0 * box.w / image.width,
                    "height": 100.0 * box.h / image.height,
                    "rotation": 0,
                    "rectanglelabels": [names[box.category]],
                },
                **({"score": box.score} if box.score is not None else {}),
            }
            for i, box in enumerate(image.boxes)
        ]
        scores = [b.score for b in image.boxes if b.score is not None]
        tasks.append(
            {
                "data": {
                    IMAGE_FIELD: image_url(image.file_name),
                    FRAME_FIELD: image.file_name,
                    "split": image.split,
                    **image.provenance,
                },
                "predictions": [
                    {
                        "model_version": model_version,
                        **({"score": min(scores)} if scores else {}),
                        "result": results,
                    }
                ],
            }
        )
    return tasks


# -- back: an export read as reviewed images --------------------------------------------------


def read_export(path: Path) -> tuple[str, list[ReviewedImage]]:
    """The reviewed images of a Label Studio JSON export or a COCO file (CVAT's), by its shape.
    Returns (the format's name, the images)."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReviewImportError(f"{path}: not a JSON file that can be read ({error})") from None
    try:
        if isinstance(document, list):
            return "label-studio", read_label_studio_export(document)
        if isinstance(document, dict) and "images" in document and "annotations" in document:
            return "coco", read_coco_export(document)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        if isinstance(error, ReviewImportError):
            raise
        raise ReviewImportError(
            f"{path}: an entry without a field this format must have, or of the wrong kind "
            f"({type(error).__name__}: {error}); export it again from the tool"
        ) from None
    raise ReviewImportError(
        f"{path}: neither a Label Studio JSON export (a list of tasks) nor a COCO file (with "
        "images and annotations)"
    )


def read_label_studio_export(tasks: Iterable[Mapping[str, Any]]) -> list[ReviewedImage]:
    """Each task with an answer: its latest annotation that was not skipped (a ground-truth one
    first). Tasks nobody answered are not reviewed and are left out."""
    reviewed = []
    for position, task in enumerate(tasks):
        data = task.get("data") or {}
        file_name = data.get(FRAME_FIELD)
        if not isinstance(file_name, str) or not file_name:
            raise ReviewImportError(
                f"task {task.get('id', position)} has no data.{FRAME_FIELD}: it was not exported "
                "by `dataminer review export` (its images are matched by that id)"
            )
        answer = task_answer(task)
        if answer is None:
            continue
        reviewed.append(_reviewed_from_results(file_name, answer.get("result") or []))
    return reviewed


def _reviewed_from_results(file_name: str, results: Iterable[Mapping[str, Any]]) -> ReviewedImage:
    rejected = False
    boxes = []
    for result in results:
        value = result.get("value") or {}
        if result.get("type") == "choices" and REJECT in (value.get("choices") or []):
            rejected = True
        elif result.get("type") == "rectanglelabels":
            boxes.append(_box_from_percent(file_name, result, value))
    return ReviewedImage(file_name, rejected, () if rejected else tuple(boxes))


def _box_from_percent(
    file_name: str, result: Mapping[str, Any], value: Mapping[str, Any]
) -> LabelledBox:
    labels = value.get("rectanglelabels") or []
    width, height = result.get("original_width"), result.get("original_height")
    if len(labels) != 1 or not width or not height:
        raise ReviewImportError(
            f"{file_name}: a box without exactly one label or without the image's original size"
        )
    if value.get("rotation") or result.get("image_rotation"):
        raise ReviewImportError(
            f"{file_name}: a rotated box or image; the dataset's boxes are upright (undo the "
            "rotation in the labelling tool)"
        )
    x, y = value["x"] * width / 100.0, value["y"] * height / 100.0
    w, h = value["width"] * width / 100.0, value["height"] * height / 100.0
    return LabelledBox(x, y, w, h, labels[0])


def read_coco_export(document: Mapping[str, Any]) -> list[ReviewedImage]:
    """Every image of a COCO file, with its boxes (none: the reviewer deleted them all). Images
    are matched by their file name without folders (CVAT may add one)."""
    names = {c["id"]: c["name"] for c in document.get("categories") or []}
    boxes: dict[Any, list[LabelledBox]] = {image["id"]: [] for image in document["images"]}
    for a in document["annotations"]:
        if a["image_id"] not in boxes or a["category_id"] not in names:
            raise ReviewImportError(
                f"annotation {a.get('id')} names an image or category the file does not have"
            )
        x, y, w, h = (float(v) for v in a["bbox"])
        boxes[a["image_id"]].append(LabelledBox(x, y, w, h, names[a["category_id"]]))
    return [
        ReviewedImage(PurePosixPath(image["file_name"]).name, False, tuple(boxes[image["id"]]))
        for image in document["images"]
    ]


def check_fits(
    reviewed: Sequence[ReviewedImage], file_names: Iterable[str], names: Sequence[str] | None
) -> None:
    """Refuse an export whose images or classes the dataset does not have, naming them."""
    known = set(file_names)
    unknown = [r.file_name for r in reviewed if r.file_name not in known]
    if unknown:
        raise ReviewImportError(
            f"{len(unknown)} of the export's {len(reviewed)} images are not in the dataset, "
            f"for example {_first(unknown)}: was it exported from another project?"
        )
    repeated = [n for n, k in Counter(r.file_name for r in reviewed).items() if k > 1]
    if repeated:
        raise ReviewImportError(f"images listed more than once: {_first(repeated)}")
    classes = set(names or [])
    strangers = sorted({b.label for r in reviewed for b in r.boxes} - classes)
    if strangers:
        have = ", ".join(names) if names else "none (the project has no detect section)"
        raise ReviewImportError(
            f"boxes of classes the project does not have: {_first(strangers)} (its classes: {have})"
        )
    bad = [r.file_name for r in reviewed for b in r.boxes if not _finite_box(b)]
    if bad:
        raise ReviewImportError(f"boxes without a positive finite size: {_first(bad)}")


def _finite_box(box: LabelledBox) -> bool:
    values = (box.x, box.y, box.w, box.h)
    return all(math.isfinite(v) for v in values) and box.w > 0 and box.h > 0


def _first(names: Sequence[str]) -> str:
    more = f" (and {len(names) - MISMATCHES_SHOWN} more)" if len(names) > MISMATCHES_SHOWN else ""
    return ", ".join(names[:MISMATCHES_SHOWN]) + more


# -- what changed -----------------------------------------------------------------------------


@dataclass
class ClassChanges:
    """What the reviewers did to one class's boxes."""

    predicted: int = 0  # boxes of the class on the reviewed images before review
    unchanged: int = 0
    moved: int = 0
    relabelled: int = 0  # counted under the class the box had
    deleted: int = 0
    added: int = 0  # counted under the class the reviewer gave

    @property
    def corrections(self) -> int:
        return self.moved + self.relabelled + self.deleted + self.added

    @property
    def rate(self) -> float:
        """Share of the class's boxes a reviewer had to correct: moved, relabelled, deleted or
        added, over the boxes there were and the ones added."""
        seen = self.predicted + self.added
        return self.corrections / seen if seen else 0.0


@dataclass
class ReviewSummary:
    """The review of a dataset: the images per state and the changes per class."""

    states: Counter = field(default_factory=Counter)  # state -> images
    classes: dict[str, ClassChanges] = field(default_factory=dict)

    @property
    def reviewed(self) -> int:
        return sum(n for state, n in self.states.items() if state != UNREVIEWED)


def compare(
    before: Sequence[LabelledBox], after: Sequence[LabelledBox], into: dict[str, ClassChanges]
) -> bool:
    """Count in `into` what became of each box of `before` in `after`; True when nothing
    changed. Boxes are paired greedily, the largest overlap first, from SAME_OBJECT_IOU on."""
    for box in before:
        into.setdefault(box.label, ClassChanges()).predicted += 1
    pairs = sorted(
        (
            (overlap, i, j)
            for i, a in enumerate(before)
            for j, b in enumerate(after)
            if (overlap := iou(a, b)) >= SAME_OBJECT_IOU
        ),
        reverse=True,
    )
    paired_before: set[int] = set()
    paired_after: set[int] = set()
    changed = False
    for _, i, j in pairs:
        if i in paired_before or j in paired_after:
            continue
        paired_before.add(i)
        paired_after.add(j)
        a, b = before[i], after[j]
        counts = into[a.label]
        if a.label != b.label:
            counts.relabelled += 1
        elif max(abs(p - q) for p, q in zip(a.edges, b.edges, strict=True)) > SAME_BOX_PIXELS:
            counts.moved += 1
        else:
            counts.unchanged += 1
            continue
        changed = True
    for i, box in enumerate(before):
        if i not in paired_before:
            into[box.label].deleted += 1
            changed = True
    for j, box in enumerate(after):
        if j not in paired_after:
            into.setdefault(box.label, ClassChanges()).added += 1
            changed = True
    return not changed


def iou(a: LabelledBox, b: LabelledBox) -> float:
    return box_iou((a.x, a.y, a.w, a.h), (b.x, b.y, b.w, b.h))


def summarize_review(
    predicted: Mapping[str, Sequence[LabelledBox]],
    corrections: Mapping[str, ReviewedImage],
    file_names: Iterable[str],
) -> tuple[ReviewSummary, dict[str, str]]:
    """The review state of every image of `file_names` (the dataset's, before rejections) and
    the changes per class, from the boxes the images had (`predicted`) and the corrections."""
    summary = ReviewSummary()
    states = {}
    for name in file_names:
        reviewed = corrections.get(name)
        if reviewed is None:
            state = UNREVIEWED
        elif reviewed.rejected:
            state = REJECTED
        else:
            same = compare(predicted.get(name, ()), reviewed.boxes, summary.classes)
            state = ACCEPTED if same else CORRECTED
        states[name] = state
        summary.states[state] += 1
    return summary, states
