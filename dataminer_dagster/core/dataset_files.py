"""The files of a project's dataset directory, and the one way they are filled: by the dataset
stage (hard links into the frame store) and by `dataminer export` (copies, or links on request).

    images/                  the kept frames
    annotations.coco.json    the detections (when the project detects)
    manifest.parquet         one row per kept frame
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from dataminer_dagster.core.files import link_or_copy, publish, remove, staging_path

IMAGES_DIR = "images"
COCO_FILE = "annotations.coco.json"
MANIFEST_FILE = "manifest.parquet"


def place_images(images: Iterable[tuple[Path, str]], images_dir: Path, *, copy: bool) -> int:
    """Put each (source file, name) into `images_dir`: a copy, or a hard link where the
    filesystem allows (a copy otherwise). Returns how many are hard links."""
    links = 0
    for source, name in images:
        if copy:
            shutil.copy2(source, images_dir / name)
        else:
            links += link_or_copy(source, images_dir / name)
    return links


def export_dataset(dataset: Path, dest: Path, *, copy: bool) -> tuple[int, int]:
    """Build a copy of `dataset` beside `dest` and rename it into place; returns (images, hard
    links)."""
    staging = staging_path(dest)
    try:
        (staging / IMAGES_DIR).mkdir(parents=True)
        source_dir = dataset / IMAGES_DIR
        images = sorted(source_dir.iterdir()) if source_dir.is_dir() else []
        links = place_images(
            ((image.resolve(), image.name) for image in images), staging / IMAGES_DIR, copy=copy
        )
        for name in (COCO_FILE, MANIFEST_FILE):
            if (dataset / name).is_file():
                shutil.copy2(dataset / name, staging / name)
        publish(staging, dest)
    finally:  # a full disk, say: no half-built copy is left to keep it full
        remove(staging)
    return len(images), links
