"""COCO object-detection JSON: build it from per-image detections, check it, write it.

Tools that read COCO expect exactly this layout (not, say, normalised xyxy boxes under another
key), so this module writes the real thing: `images`, `annotations` with
`bbox = [x, y, w, h]` in pixels, `area`, `iscrowd` and a `score`, and `categories`. Ids are stable:
images are numbered in file-name order, categories in the order the caller gives them (the
project config's prompts or classes), annotations in image order then detection order, all from 1.

Pure Python: no torch, no Dagster. Detections are `Detection`s, which the detectors return.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataminer_dagster.core.files import write_atomically

# Boxes are stored to 1/100 pixel: finer digits are noise and only make the file larger.
BOX_DECIMALS = 2
SCORE_DECIMALS = 5
# Rounding a clipped box can move its far edge up to half a unit of the last decimal past the
# image border; the validator allows that much.
EDGE_TOLERANCE = 0.5 * 10**-BOX_DECIMALS
MAX_REPORTED_PROBLEMS = 20


@dataclass(frozen=True)
class Detection:
    """One detected object: box in pixels (top-left corner + size, as COCO), score, category."""

    x: float
    y: float
    w: float
    h: float
    score: float
    label: str


@dataclass(frozen=True)
class ImageDetections:
    """One image of the dataset and what was detected on it."""

    file_name: str  # path relative to the dataset's image root, with forward slashes
    width: int
    height: int
    detections: Sequence[Detection] = ()


class CocoFormatError(ValueError):
    """A COCO document that breaks the schema or refers to ids that do not exist."""

    def __init__(self, problems: Sequence[str], source: str | None = None):
        self.problems = list(problems)
        where = f" in {source}" if source else ""
        shown = self.problems[:MAX_REPORTED_PROBLEMS]
        more = len(self.problems) - len(shown)
        lines = [f"Invalid COCO detection JSON{where} ({len(self.problems)} problem(s)):"]
        lines += [f"  - {p}" for p in shown]
        if more:
            lines.append(f"  ... and {more} more")
        super().__init__("\n".join(lines))


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two xywh boxes (0 where neither has an area)."""
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    w = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    h = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    union = aw * ah + bw * bh - w * h
    return w * h / union if union > 0 else 0.0


def clip_box(
    x: float, y: float, w: float, h: float, width: int, height: int
) -> tuple[float, float, float, float] | None:
    """Clip an xywh box to a `width` x `height` image; None when nothing of it is left."""
    x, y, w, h = float(x), float(y), float(w), float(h)
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        return None
    x0, y0 = round(max(0.0, x), BOX_DECIMALS), round(max(0.0, y), BOX_DECIMALS)
    x1, y1 = (
        round(min(float(width), x + w), BOX_DECIMALS),
        round(min(float(height), y + h), BOX_DECIMALS),
    )
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, round(x1 - x0, BOX_DECIMALS), round(y1 - y0, BOX_DECIMALS)


def build_coco(
    images: Iterable[ImageDetections],
    categories: Sequence[str],
    *,
    supercategory: str = "object",
    info: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a COCO detection document.

    Every image is listed, with or without detections. Boxes are clipped to their image and those
    left with no area are dropped. A detection whose label is not one of `categories` is an error:
    it means the detector and the project config disagree.
    """
    if not categories:
        raise ValueError(
            "COCO categories must not be empty: pass the detector's prompts or classes"
        )
    duplicates = sorted(name for name, n in Counter(categories).items() if n > 1)
    if duplicates:
        raise ValueError(f"COCO category names must be unique; repeated: {duplicates}")
    category_ids = {name: i for i, name in enumerate(categories, start=1)}

    ordered = sorted(images, key=lambda item: item.file_name)
    names = [item.file_name for item in ordered]
    repeated = sorted({n for n, m in zip(names, names[1:], strict=False) if n == m})
    if repeated:
        raise ValueError(f"Each image may appear once in a COCO file; repeated: {repeated[:5]}")

    coco_images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for image_id, item in enumerate(ordered, start=1):
        coco_images.append(
            {
                "id": image_id,
                "file_name": item.file_name,
                "width": int(item.width),
                "height": int(item.height),
            }
        )
        for det in item.detections:
            if det.label not in category_ids:
                raise ValueError(
                    f"Detection label {det.label!r} on image {item.file_name!r} is not a category; "
                    f"categories are {list(categories)}"
                )
            box = clip_box(det.x, det.y, det.w, det.h, item.width, item.height)
            if box is None:
                continue
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": category_ids[det.label],
                    "bbox": list(box),
                    "area": round(box[2] * box[3], BOX_DECIMALS),
                    "iscrowd": 0,
                    "score": round(float(det.score), SCORE_DECIMALS),
                }
            )
    document: dict[str, Any] = {
        "images": coco_images,
        "annotations": annotations,
        "categories": [
            {"id": cid, "name": name, "supercategory": supercategory}
            for name, cid in category_ids.items()
        ],
    }
    if info is not None:
        document = {"info": dict(info), **document}
    return document


def coco_problems(document: Any) -> list[str]:
    """Every schema or consistency problem of a COCO detection document; empty when it is valid."""
    if not isinstance(document, Mapping):
        return [f"the document must be a JSON object, got {type(document).__name__}"]
    problems: list[str] = []
    sections = {}
    for key in ("images", "annotations", "categories"):
        value = document.get(key)
        if not isinstance(value, list):
            problems.append(f"'{key}' must be a list, got {_kind(value)}")
            value = []
        sections[key] = value
    images = _check_images(sections["images"], problems)
    category_ids = _check_categories(sections["categories"], problems)
    _check_annotations(sections["annotations"], images, category_ids, problems)
    return problems


def validate_coco(document: Any, source: str | None = None) -> None:
    """Raise `CocoFormatError` listing every problem unless `document` is valid COCO detection JSON."""
    problems = coco_problems(document)
    if problems:
        raise CocoFormatError(problems, source)


def write_coco(document: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate and write `document` atomically (temporary sibling, then rename)."""
    path = Path(path)
    validate_coco(document, source=str(path))
    return write_atomically(path, json.dumps(document, ensure_ascii=False, separators=(",", ":")))


def read_coco(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load and validate a COCO detection file."""
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    validate_coco(document, source=str(path))
    return document


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_images(images: list[Any], problems: list[str]) -> dict[int, tuple[float, float]]:
    """Check the images section; return the (width, height) of every usable image id."""
    sizes: dict[int, tuple[float, float]] = {}
    file_names: set[str] = set()
    for i, image in enumerate(images):
        where = f"images[{i}]"
        if not isinstance(image, Mapping):
            problems.append(f"{where} must be an object, got {_kind(image)}")
            continue
        image_id = image.get("id")
        if not _is_int(image_id):
            problems.append(f"{where}.id must be an integer, got {image_id!r}")
        elif image_id in sizes:
            problems.append(f"{where}.id {image_id} is used by another image")
        file_name = image.get("file_name")
        if not isinstance(file_name, str) or not file_name:
            problems.append(f"{where}.file_name must be a non-empty string, got {file_name!r}")
        elif file_name in file_names:
            problems.append(f"{where}.file_name {file_name!r} is listed twice")
        else:
            file_names.add(file_name)
        width, height = image.get("width"), image.get("height")
        size_ok = True
        for key, value in (("width", width), ("height", height)):
            if not _is_int(value) or value <= 0:
                problems.append(f"{where}.{key} must be a positive integer, got {value!r}")
                size_ok = False
        if _is_int(image_id) and image_id not in sizes and size_ok:
            sizes[image_id] = (width, height)
    return sizes


def _record_id(where: str, value: Any, seen: set[int], kind: str, problems: list[str]) -> None:
    """Note a problem unless `value` is an integer id not seen before; record it when it is."""
    if not _is_int(value):
        problems.append(f"{where}.id must be an integer, got {value!r}")
    elif value in seen:
        problems.append(f"{where}.id {value} is used by another {kind}")
    else:
        seen.add(value)


def _check_categories(categories: list[Any], problems: list[str]) -> set[int]:
    ids: set[int] = set()
    names: set[str] = set()
    for i, category in enumerate(categories):
        where = f"categories[{i}]"
        if not isinstance(category, Mapping):
            problems.append(f"{where} must be an object, got {_kind(category)}")
            continue
        _record_id(where, category.get("id"), ids, "category", problems)
        name = category.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name must be a non-empty string, got {name!r}")
        elif name in names:
            problems.append(f"{where}.name {name!r} is used by another category")
        else:
            names.add(name)
        if not isinstance(category.get("supercategory"), str):
            problems.append(
                f"{where}.supercategory must be a string, got {category.get('supercategory')!r}"
            )
    if not categories:
        problems.append("'categories' is empty: a detection dataset needs at least one category")
    return ids


def _check_annotations(
    annotations: list[Any],
    image_sizes: Mapping[int, tuple[float, float]],
    category_ids: set[int],
    problems: list[str],
) -> None:
    ids: set[int] = set()
    for i, annotation in enumerate(annotations):
        where = f"annotations[{i}]"
        if not isinstance(annotation, Mapping):
            problems.append(f"{where} must be an object, got {_kind(annotation)}")
            continue
        _record_id(where, annotation.get("id"), ids, "annotation", problems)
        image_id = annotation.get("image_id")
        if image_id not in image_sizes:
            problems.append(f"{where}.image_id {image_id!r} does not name a listed image")
        if annotation.get("category_id") not in category_ids:
            problems.append(
                f"{where}.category_id {annotation.get('category_id')!r} does not name a category"
            )
        _check_bbox(annotation.get("bbox"), image_sizes.get(image_id), where, problems)
        area = annotation.get("area")
        if not _is_number(area) or area <= 0:
            problems.append(f"{where}.area must be a positive number, got {area!r}")
        if annotation.get("iscrowd") not in (0, 1) or isinstance(annotation.get("iscrowd"), bool):
            problems.append(f"{where}.iscrowd must be 0 or 1, got {annotation.get('iscrowd')!r}")
        if "score" in annotation:
            score = annotation["score"]
            if not _is_number(score) or not 0.0 <= score <= 1.0:
                problems.append(f"{where}.score must be a number in [0, 1], got {score!r}")


def _check_bbox(
    bbox: Any, size: tuple[float, float] | None, where: str, problems: list[str]
) -> None:
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
        problems.append(f"{where}.bbox must be [x, y, width, height] in pixels, got {bbox!r}")
        return
    x, y, w, h = bbox
    if w <= 0 or h <= 0:
        problems.append(f"{where}.bbox {bbox} has no area (width and height must be > 0)")
    if size is not None:
        width, height = size
        if x < 0 or y < 0 or x + w > width + EDGE_TOLERANCE or y + h > height + EDGE_TOLERANCE:
            problems.append(f"{where}.bbox {bbox} leaves its {width}x{height} image")
