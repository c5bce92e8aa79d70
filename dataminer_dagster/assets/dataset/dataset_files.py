"""The files of a project's dataset directory, and the one way its images are placed: by the
dataset stage (hard links into the frame store) and by `dataminer export` (copies, or links on
request). The training formats and the report beside them: assets/dataset/dataset_formats.py.

    images/                  the kept frames
    annotations.coco.json    the detections (when the project detects)
    manifest.parquet         one row per kept frame
    version.json             which version of the dataset this is
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from dataminer_dagster.core.files import link_or_copy

IMAGES_DIR = "images"
COCO_FILE = "annotations.coco.json"
MANIFEST_FILE = "manifest.parquet"
VERSION_FILE = "version.json"  # which version of the dataset (assets/dataset/dataset_versions.py)


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
