"""Dataset versions: every build whose content differs from the last one is kept, numbered (by the
database: store.py) and never changed again, in `<output>/dataset_versions/v<N>/`:

    version.json             its number, content hash, when, how many images, what produced it
                             (the config's fingerprints, the model ids)
    manifest.parquet         as in the dataset
    annotations.coco.json    as in the dataset, when the project detects
    images/                  hard links to the images it had (they cost disk only once the
                             dataset no longer has them)

The content hash covers what a person trains on: each image's name, split and size, and its
boxes with their class names (not the scores, not when it was built). A build with the same
content as the last version is that version again: no new number. `diff_versions` says what was
added, removed and relabelled between two versions, images matched by file name (a frame's name is
its video and frame index: stable across builds).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dataminer_dagster.assets.dataset.dataset_files import (
    COCO_FILE,
    IMAGES_DIR,
    MANIFEST_FILE,
    VERSION_FILE,
    place_images,
)
from dataminer_dagster.assets.dataset.dataset_formats import DatasetContents, read_contents

_PREFIX = "v"


class DatasetVersionError(ValueError):
    """A version that does not exist, or a versions folder that cannot be read."""


@dataclass(frozen=True)
class DatasetVersion:
    number: int
    content_hash: str
    images: int
    created_at: str
    produced_by: Mapping[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "version": self.number,
            "content_hash": self.content_hash,
            "images": self.images,
            "created_at": self.created_at,
            "produced_by": dict(self.produced_by),
        }


def _labels(contents: DatasetContents) -> dict[str, tuple]:
    """file name -> (split, width, height, sorted boxes with class names and rounded pixels)."""
    names = contents.names or []
    return {
        image.file_name: (
            image.split,
            image.width,
            image.height,
            tuple(
                sorted(
                    (names[b.category], round(b.x, 1), round(b.y, 1), round(b.w, 1), round(b.h, 1))
                    for b in image.boxes
                )
            ),
        )
        for image in contents.images
    }


def content_hash(contents: DatasetContents) -> str:
    """SHA-256 of what a dataset holds for training (see the module's docstring)."""
    canonical = json.dumps(sorted(_labels(contents).items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def list_versions(versions_dir: Path) -> list[DatasetVersion]:
    """The kept versions, oldest first."""
    found = []
    for folder in versions_dir.glob(f"{_PREFIX}*"):
        if folder.name[len(_PREFIX) :].isdigit() and (folder / VERSION_FILE).is_file():
            raw = json.loads((folder / VERSION_FILE).read_text())
            found.append(
                DatasetVersion(
                    raw["version"],
                    raw["content_hash"],
                    raw["images"],
                    raw["created_at"],
                    raw.get("produced_by", {}),
                )
            )
    return sorted(found, key=lambda v: v.number)


def next_version(
    versions_dir: Path,
    contents: DatasetContents,
    produced_by: Mapping[str, Any],
    allocate: Callable[[], int],
) -> tuple[DatasetVersion, bool]:
    """The version a build with `contents` is: the latest one when its content is the same, else
    a new one numbered by `allocate` (the database's counter: never a number another build got).
    Returns (version, new)."""
    digest = content_hash(contents)
    kept = list_versions(versions_dir)
    if kept and kept[-1].content_hash == digest:
        return kept[-1], False
    number = allocate()
    created = datetime.now(UTC).isoformat(timespec="seconds")
    return DatasetVersion(number, digest, len(contents.images), created, produced_by), True


def version_folder(versions_dir: Path, number: int) -> Path:
    """Where version `number` is kept."""
    return versions_dir / f"{_PREFIX}{number}"


def build_version(dataset_dir: Path, staging: Path, version: DatasetVersion) -> None:
    """Build, in `staging`, the folder that keeps the dataset built in `dataset_dir` as `version`
    (the caller publishes it as `version_folder`, so that no half-written version is ever seen)."""
    (staging / IMAGES_DIR).mkdir(parents=True)
    for name in (MANIFEST_FILE, COCO_FILE):
        if (dataset_dir / name).is_file():
            shutil.copy2(dataset_dir / name, staging / name)
    images = sorted(p.name for p in (dataset_dir / IMAGES_DIR).iterdir())
    place_images(
        ((dataset_dir / IMAGES_DIR / n, n) for n in images), staging / IMAGES_DIR, copy=False
    )
    (staging / VERSION_FILE).write_text(json.dumps(version.as_json(), indent=2) + "\n")


@dataclass(frozen=True)
class VersionDiff:
    old: int
    new: int
    added: list[str]
    removed: list[str]
    relabelled: list[str]  # its boxes or their classes changed
    moved: list[str]  # another split

    def lines(self, show: int = 5) -> list[str]:
        """What changed, in words, with the first `show` file names of each kind."""
        out = [f"dataset v{self.old} -> v{self.new}:"]
        for what, names in (
            ("added", self.added),
            ("removed", self.removed),
            ("relabelled", self.relabelled),
            ("moved to another split", self.moved),
        ):
            more = f" (and {len(names) - show} more)" if len(names) > show else ""
            shown = f": {', '.join(names[:show])}{more}" if names else ""
            out.append(f"  {len(names)} {what}{shown}")
        return out


def diff_versions(versions_dir: Path, old: int, new: int) -> VersionDiff:
    """What changed from version `old` to version `new`."""
    labels = {}
    for number in (old, new):
        folder = version_folder(versions_dir, number)
        if not (folder / VERSION_FILE).is_file():
            have = ", ".join(f"v{v.number}" for v in list_versions(versions_dir)) or "none"
            raise DatasetVersionError(f"no dataset version v{number} (versions kept: {have})")
        labels[number] = _labels(read_contents(folder))
    before, after = labels[old], labels[new]
    both = sorted(before.keys() & after.keys())
    return VersionDiff(
        old,
        new,
        added=sorted(after.keys() - before.keys()),
        removed=sorted(before.keys() - after.keys()),
        relabelled=[n for n in both if before[n][3] != after[n][3]],
        moved=[n for n in both if before[n][0] != after[n][0]],
    )
