"""The training formats of a dataset, per split, written from the dataset's own files: its
manifest (one row per image, with its `split`), its COCO annotations (the boxes) and images/.

    coco/<split>.json        COCO detection JSON of the split; file names relative to images/
    yolo/data.yaml           Ultralytics: path, train, val, test (when it has images), names {id: name}
    yolo/images/<split>/     the split's images
    yolo/labels/<split>/     one .txt per image: `class cx cy w h` normalised to 0-1, empty
                             for an image without boxes
    hf/<split>/              Hugging Face imagefolder: the split's images and metadata.jsonl,
                             one line per image: file_name, objects {bbox: [[x, y, w, h]] in
                             pixels, category: [class id]} and the manifest's provenance

Every image file is a hard link to the file in images/ (itself a link into the frame store): no
format costs a copy of an image, unless the folders are on different filesystems. The dataset
stage writes them in its staging directory; `dataminer export` into the export's. The same
writers serve both, so an export is the dataset as the stage would build it at that place.

Ultralytics' `yolo train` fails outright on an empty train or val split, so without images in
both no data.yaml is written; the folder holds a note that says why instead. A dataset without
annotations (no detect section) has no boxes: its YOLO format is refused (the config refuses it
first), its COCO splits are not written, and its imagefolder has no `objects`.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataminer_dagster.assets.dataset.dataset_files import (
    COCO_FILE,
    IMAGES_DIR,
    MANIFEST_FILE,
    VERSION_FILE,
    place_images,
)
from dataminer_dagster.assets.dataset.dataset_splits import SPLITS
from dataminer_dagster.core.coco import write_coco
from dataminer_dagster.core.files import publish, remove, staging_path

FORMATS = ("coco", "yolo", "hf")
COCO_SPLITS_DIR = "coco"
YOLO_DIR = "yolo"
HF_DIR = "hf"
YOLO_DATA_YAML = "data.yaml"
YOLO_NOTE = "NO_DATA_YAML.txt"
HF_METADATA = "metadata.jsonl"
# The folder names `datasets` reads as its train, validation and test splits.
HF_SPLIT_DIRS = {"train": "train", "val": "validation", "test": "test"}
REPORT_FILE = "report.md"
REPORT_DIR = "report"
# What of the manifest travels with each image of the imagefolder: where it came from.
PROVENANCE_COLUMNS = (
    "video_id",
    "source_url",
    "sources",
    "video_title",
    "frame_index",
    "timestamp",
)
LABEL_DECIMALS = 6


@dataclass(frozen=True)
class Box:
    """One box of an image: pixels, top-left corner and size (as COCO), and its class id (0-based,
    the position of its category in the COCO file's category order)."""

    x: float
    y: float
    w: float
    h: float
    category: int
    score: float | None = None  # the detector's, where the annotation has one


@dataclass(frozen=True)
class SplitImage:
    file_name: str  # in images/
    split: str
    width: int
    height: int
    boxes: tuple[Box, ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetContents:
    """What the formats are written from: every image of the manifest, in its order, and the
    class names (None: the dataset has no annotations)."""

    images: list[SplitImage]
    names: list[str] | None
    coco: dict | None


@dataclass(frozen=True)
class FormatsWritten:
    images: dict[str, dict[str, int]]  # format -> split -> images written
    notes: list[str]  # what a person should know: a data.yaml not written, and why


class DatasetFormatError(ValueError):
    """A format that cannot be written from this dataset; the message says what to do."""


def read_contents(dataset_dir: Path) -> DatasetContents:
    """The images, splits, boxes and provenance of the dataset in `dataset_dir`."""
    import pandas as pd

    manifest = pd.read_parquet(dataset_dir / MANIFEST_FILE)
    if "split" not in manifest:
        raise DatasetFormatError(
            f"the dataset in {dataset_dir} was made before splits: its manifest has no split "
            "column; make it again (`dataminer run CONFIG`)"
        )
    coco_path = dataset_dir / COCO_FILE
    coco = json.loads(coco_path.read_text()) if coco_path.is_file() else None
    boxes: dict[str, list[Box]] = {name: [] for name in manifest["file_name"]}
    names = None
    if coco is not None:
        categories = sorted(coco["categories"], key=lambda c: c["id"])
        names = [c["name"] for c in categories]
        index = {c["id"]: i for i, c in enumerate(categories)}
        file_of = {image["id"]: image["file_name"] for image in coco["images"]}
        for a in coco["annotations"]:
            boxes[file_of[a["image_id"]]].append(
                Box(*a["bbox"], index[a["category_id"]], a.get("score"))
            )
    provenance = [c for c in PROVENANCE_COLUMNS if c in manifest]
    images = [
        SplitImage(
            row["file_name"],
            row["split"],
            int(row["width"]),
            int(row["height"]),
            tuple(boxes[row["file_name"]]),
            {c: _plain(row[c]) for c in provenance},
        )
        for row in manifest.to_dict("records")
    ]
    return DatasetContents(images, names, coco)


def write_formats(
    dataset_dir: Path, contents: DatasetContents, formats: Sequence[str], *, published_at: Path
) -> FormatsWritten:
    """Write each of `formats` into `dataset_dir`, from its `contents` (`read_contents`);
    `published_at`: where the folder will be once renamed into place (data.yaml names its
    absolute path)."""
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise DatasetFormatError(f"unknown formats {unknown}; the formats are {list(FORMATS)}")
    images_dir = dataset_dir / IMAGES_DIR
    written: dict[str, dict[str, int]] = {}
    notes: list[str] = []
    if "coco" in formats:
        if contents.coco is None:
            notes.append(
                "coco: no splits written: the dataset has no annotations (no detect section)"
            )
        else:
            written["coco"] = write_coco_splits(contents.coco, contents.images, dataset_dir)
    if "yolo" in formats:
        if contents.names is None:
            raise DatasetFormatError(
                "yolo is a format of boxes and the dataset has no annotations: the project "
                "needs a detect section"
            )
        written["yolo"], note = write_yolo(
            dataset_dir / YOLO_DIR,
            contents.images,
            contents.names,
            images_dir,
            published_at=published_at / YOLO_DIR,
        )
        notes += [note] if note else []
    if "hf" in formats:
        written["hf"] = write_imagefolder(
            dataset_dir / HF_DIR, contents.images, contents.names, images_dir
        )
    return FormatsWritten(written, notes)


def split_counts(images: Iterable[SplitImage]) -> dict[str, int]:
    counts = Counter(image.split for image in images)
    return {split: counts.get(split, 0) for split in SPLITS}


def write_coco_splits(
    coco: Mapping[str, Any], images: Sequence[SplitImage], dataset_dir: Path
) -> dict[str, int]:
    """coco/<split>.json for each split with images: the split's images, their annotations and
    every category (so that class ids agree across splits)."""
    split_of = {image.file_name: image.split for image in images}
    out = dataset_dir / COCO_SPLITS_DIR
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in SPLITS:
        chosen = [i for i in coco["images"] if split_of.get(i["file_name"]) == split]
        ids = {i["id"] for i in chosen}
        counts[split] = len(chosen)
        if not chosen:
            continue
        document = {
            **{k: v for k, v in coco.items() if k not in ("images", "annotations")},
            "images": chosen,
            "annotations": [a for a in coco["annotations"] if a["image_id"] in ids],
        }
        write_coco(document, out / f"{split}.json")
    return counts


def write_yolo(
    out: Path,
    images: Sequence[SplitImage],
    names: Sequence[str],
    images_dir: Path,
    *,
    published_at: Path,
) -> tuple[dict[str, int], str | None]:
    """The Ultralytics layout in `out`; returns the images per split, and a note when no
    data.yaml could be written (an empty train or val split)."""
    counts = split_counts(images)
    out.mkdir(parents=True)
    for split in SPLITS:
        chosen = [i for i in images if i.split == split]
        if not chosen:
            continue
        (out / "images" / split).mkdir(parents=True)
        (out / "labels" / split).mkdir(parents=True)
        place_images(
            ((images_dir / i.file_name, i.file_name) for i in chosen),
            out / "images" / split,
            copy=False,
        )
        for image in chosen:
            label = out / "labels" / split / f"{Path(image.file_name).stem}.txt"
            label.write_text(
                "".join(f"{yolo_line(b, image.width, image.height)}\n" for b in image.boxes)
            )
    empty = [s for s in ("train", "val") if not counts[s]]
    if empty:
        note = (
            f"yolo: no {YOLO_DATA_YAML}: the {' and '.join(empty)} split"
            f"{'s are' if len(empty) > 1 else ' is'} empty, and `yolo train` needs images in "
            "both; add videos to the project, or change dataset.splits"
        )
        (out / YOLO_NOTE).write_text(note + "\n")
        return counts, note
    write_data_yaml(out / YOLO_DATA_YAML, published_at, names, test=counts["test"] > 0)
    return counts, None


def yolo_line(box: Box, width: int, height: int) -> str:
    """`class cx cy w h`, the centre and size as fractions of the image's width and height."""

    def fraction(value: float, whole: int) -> str:
        return f"{min(max(value / whole, 0.0), 1.0):.{LABEL_DECIMALS}f}"

    return " ".join(
        [
            str(box.category),
            fraction(box.x + box.w / 2, width),
            fraction(box.y + box.h / 2, height),
            fraction(box.w, width),
            fraction(box.h, height),
        ]
    )


def write_data_yaml(path: Path, root: Path, names: Sequence[str], *, test: bool) -> None:
    """Ultralytics' dataset file: `path` absolute (Ultralytics reads a relative one against its
    own datasets directory, or the working directory), `names` a mapping of class id to name."""
    import yaml

    document: dict[str, Any] = {
        "path": str(root),
        "train": "images/train",
        "val": "images/val",
    }
    if test:
        document["test"] = "images/test"
    document["names"] = dict(enumerate(names))
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def point_yolo_at(yolo_dir: Path) -> None:
    """Make the data.yaml in `yolo_dir` name where it is now (after its folder moved)."""
    import yaml

    path = yolo_dir / YOLO_DATA_YAML
    if not path.is_file():
        return
    document = yaml.safe_load(path.read_text())
    document["path"] = str(yolo_dir.resolve())
    path.write_text(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def write_imagefolder(
    out: Path, images: Sequence[SplitImage], names: Sequence[str] | None, images_dir: Path
) -> dict[str, int]:
    """The Hugging Face imagefolder layout in `out`: a folder per split with images, holding
    metadata.jsonl. `objects` holds each image's boxes (COCO pixels) and class ids; without
    `names` (no annotations) there is no `objects`."""
    counts = split_counts(images)
    out.mkdir(parents=True)
    for split in SPLITS:
        chosen = [i for i in images if i.split == split]
        if not chosen:
            continue
        folder = out / HF_SPLIT_DIRS[split]
        folder.mkdir(parents=True)
        place_images(((images_dir / i.file_name, i.file_name) for i in chosen), folder, copy=False)
        with (folder / HF_METADATA).open("w", encoding="utf-8") as f:
            for image in chosen:
                row: dict[str, Any] = {"file_name": image.file_name}
                if names is not None:
                    row["objects"] = {
                        "bbox": [[b.x, b.y, b.w, b.h] for b in image.boxes],
                        "category": [b.category for b in image.boxes],
                    }
                row.update(image.provenance)
                f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    return counts


def format_file_counts(dataset_dir: Path) -> dict[str, dict[str, dict[str, int]]]:
    """What each format folder in `dataset_dir` holds per split: {format: {split: {what: n}}}
    (coco: images; yolo: images and labels; hf: images and metadata rows)."""
    found: dict[str, dict[str, dict[str, int]]] = {}
    coco_dir = dataset_dir / COCO_SPLITS_DIR
    if coco_dir.is_dir():
        found["coco"] = {
            split: {"images": len(json.loads(path.read_text())["images"]) if path.is_file() else 0}
            for split in SPLITS
            for path in [coco_dir / f"{split}.json"]
        }
    yolo_dir = dataset_dir / YOLO_DIR
    if yolo_dir.is_dir():
        found["yolo"] = {
            split: {
                "images": _files(yolo_dir / "images" / split),
                "labels": _files(yolo_dir / "labels" / split, ".txt"),
            }
            for split in SPLITS
        }
    hf_dir = dataset_dir / HF_DIR
    if hf_dir.is_dir():
        found["hf"] = {}
        for split in SPLITS:
            folder = hf_dir / HF_SPLIT_DIRS[split]
            metadata = folder / HF_METADATA
            rows = len(metadata.read_text().splitlines()) if metadata.is_file() else 0
            images = _files(folder) - (1 if metadata.is_file() else 0)
            found["hf"][split] = {"images": images, "metadata_rows": rows}
    return found


def _files(folder: Path, suffix: str | None = None) -> int:
    if not folder.is_dir():
        return 0
    return sum(
        1 for p in folder.iterdir() if p.is_file() and (suffix is None or p.suffix == suffix)
    )


def _plain(value: Any) -> Any:
    """A manifest value as JSON holds it: lists for arrays, None for a missing number."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def export_dataset(
    dataset: Path, dest: Path, *, copy: bool, formats: Sequence[str]
) -> tuple[int, int, FormatsWritten]:
    """Build a copy of `dataset` beside `dest` and rename it into place: its images (copies, or
    hard links into the frame store), manifest, annotations and report, and `formats` written
    anew for `dest`; returns (images, hard links among them, the formats written)."""
    staging = staging_path(dest)
    try:
        (staging / IMAGES_DIR).mkdir(parents=True)
        source_dir = dataset / IMAGES_DIR
        images = sorted(source_dir.iterdir()) if source_dir.is_dir() else []
        links = place_images(
            ((image.resolve(), image.name) for image in images), staging / IMAGES_DIR, copy=copy
        )
        for name in (COCO_FILE, MANIFEST_FILE, REPORT_FILE, VERSION_FILE):
            if (dataset / name).is_file():
                shutil.copy2(dataset / name, staging / name)
        if (dataset / REPORT_DIR).is_dir():
            shutil.copytree(dataset / REPORT_DIR, staging / REPORT_DIR)
        written = write_formats(staging, read_contents(staging), formats, published_at=dest)
        publish(staging, dest)
    finally:  # a format it cannot write, a full disk: no half-built copy is left behind
        remove(staging)
    return len(images), links, written
