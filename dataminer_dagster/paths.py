"""Where files live, and where a project may put its own. Paths stored in the database are
relative to the data directory.

A project owns its output directory only when it created it or found it empty: registration writes
a marker file naming the project there, and a deletion removes nothing but the entries a project
writes (`ProjectPaths.own_entries`), and only where that marker names the project.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dataminer_dagster.core.path_kinds import not_a_directory

OUTPUT_MARKER = ".dataminer-project"


@dataclass(frozen=True)
class DataPaths:
    root: Path  # $DATAMINER_DATA_DIR: videos, frames and caches shared by all projects

    @property
    def videos_dir(self) -> Path:
        return self.root / "videos"

    def frames_dir(self, video_id: str, profile_id: str) -> Path:
        return self.root / "frames" / video_id / profile_id

    def embeddings_dir(self) -> Path:
        return self.root / "cache" / "embeddings"

    def default_project_dir(self, project: str) -> Path:
        return self.root / "projects" / project

    def relative(self, path: Path) -> str:
        """The form stored in the database: relative to the root when inside it."""
        path = Path(path)
        try:
            return str(path.relative_to(self.root))
        except ValueError:
            return str(path)

    def absolute(self, stored: str) -> Path:
        path = Path(stored)
        return path if path.is_absolute() else self.root / path


FRAMES_MANIFEST = "manifest.parquet"


@dataclass(frozen=True)
class ProjectPaths:
    """A project's results: small tables and links, never copies of frames."""

    root: Path  # the project's output_dir

    @property
    def filter_dir(self) -> Path:
        return self.root / "filter"

    def filter_table(self, video_id: str) -> Path:
        return self.filter_dir / f"{video_id}.parquet"

    @property
    def dedup_table(self) -> Path:
        return self.root / "dedup" / "frames.parquet"

    @property
    def dedup_index_dir(self) -> Path:
        """The kept frames' embeddings, for incremental dedup (assets/dedup/kept_index.py)."""
        return self.root / "dedup" / "kept_index"

    @property
    def detections_dir(self) -> Path:
        return self.root / "detections"

    @property
    def detections_table(self) -> Path:
        return self.detections_dir / "detections.parquet"

    @property
    def coco_file(self) -> Path:
        return self.detections_dir / "annotations.coco.json"

    @property
    def dataset_dir(self) -> Path:
        return self.root / "dataset"

    @property
    def dataset_versions_dir(self) -> Path:
        return self.root / "dataset_versions"

    @property
    def previews_dir(self) -> Path:
        return self.root / "previews"

    @property
    def review_dir(self) -> Path:
        """The corrections of the dataset's reviews (assets/dataset/corrections.py)."""
        return self.root / "review"

    @property
    def calibration_dir(self) -> Path:
        """A calibration's sample and its answers (assets/filter/calibration_review.py)."""
        return self.root / "calibration"

    @property
    def marker(self) -> Path:
        return self.root / OUTPUT_MARKER

    def own_entries(self) -> list[Path]:
        """Everything a project writes in its output directory, the marker last."""
        return [
            self.filter_dir,
            self.dedup_table.parent,
            self.detections_dir,
            self.dataset_dir,
            self.dataset_versions_dir,
            self.previews_dir,
            self.review_dir,
            self.calibration_dir,
            self.marker,
        ]

    def owner(self) -> str | None:
        """The project that the marker names, if there is one."""
        try:
            return self.marker.read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            return None


class UnsafePathError(ValueError):
    """A project names a directory it may not write to or delete from."""


def check_backup_dest(dest: Path, data_dir: Path) -> None:
    """A local backup destination must lie outside the data directory: a copy onto the frame
    store verifies against itself, and a backup that lets the frames go would delete the only
    copy."""
    if overlaps(dest, data_dir):
        raise UnsafePathError(
            f"backup.dest {dest} overlaps the data directory ({data_dir}) that holds the frames "
            "it backs up; choose a directory on another disk or a remote user@host:/path"
        )


def claim_output_dir(
    root: Path,
    project: str,
    *,
    protected: Mapping[str, Path],
    projects_dir: Path,
    others: Mapping[str, Path],
) -> None:
    """Make `root` the output directory of `project`, or say why it cannot be.

    Refused: a directory that is, holds or lies inside a protected one (`protected`: the data
    directory, DATAMINER_HOME, DAGSTER_HOME, $HOME; inside is allowed for $HOME and for
    `projects_dir`, the default home of outputs), one that overlaps another project's output
    (`others`: name -> directory), and an existing directory with content that a project did not
    write (another project's marker, or any foreign entry). On success `root` exists with the
    marker naming `project`."""
    paths = ProjectPaths(root)
    for what, other in protected.items():
        if overlaps(root, other) and not _allowed_inside(root, other, what, projects_dir):
            raise UnsafePathError(
                f"output_dir {root} overlaps {what} ({other}); choose a directory of its own "
                f"(default: {projects_dir / project})"
            )
    for name, other in others.items():
        if overlaps(root, other):
            raise UnsafePathError(
                f"output_dir {root} overlaps the output directory of project {name} ({other}); "
                "two projects cannot share results"
            )
    owner = paths.owner()
    if owner not in (None, project):
        raise UnsafePathError(f"output_dir {root} belongs to project {owner} (see {paths.marker})")
    if owner is None and root.is_dir():
        own = {p.name for p in paths.own_entries()}
        foreign = sorted(e.name for e in root.iterdir() if e.name not in own)
        if foreign:
            raise UnsafePathError(
                f"output_dir {root} is not empty ({', '.join(foreign[:5])}"
                f"{', ...' if len(foreign) > 5 else ''}); a project writes only into a new or "
                "empty directory"
            )
    _check_can_be_a_directory(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if owner is None:
            paths.marker.write_text(f"{project}\n")
    except OSError as exc:  # a folder this user may not write to, a read-only filesystem
        raise UnsafePathError(
            f"output_dir {root} cannot be made: {exc.strerror or exc} ({exc.filename})"
        ) from None


def _check_can_be_a_directory(root: Path) -> None:
    """Neither `root` nor a folder above it is something else (a file, /dev/null)."""
    for path in (root, *root.parents):
        if os.path.lexists(path) and (problem := not_a_directory(path)):
            if path == root:
                raise UnsafePathError(
                    f"output_dir {root} is {problem}; name a new or empty directory"
                )
            raise UnsafePathError(f"output_dir {root} cannot be made: {path} is {problem}")


def _allowed_inside(root: Path, other: Path, what: str, projects_dir: Path) -> bool:
    """Inside $HOME, or inside the default projects directory (which itself lies in the data
    directory and DATAMINER_HOME), an output directory is fine."""
    if not _inside(root, other):
        return False
    return what == "$HOME" or _inside(root, projects_dir)


def overlaps(a: Path, b: Path) -> bool:
    """Whether one of two directories is, holds or lies inside the other, also through
    symbolic links and bind mounts (compared by device and inode where they exist)."""
    identity = _identity(a)
    same = a.resolve() == b.resolve() or (identity is not None and identity == _identity(b))
    return same or _inside(a, b) or _inside(b, a)


def _inside(inner: Path, outer: Path) -> bool:
    """`inner` lies strictly inside `outer`."""
    inner, outer = inner.resolve(), outer.resolve()
    if outer in inner.parents:
        return True
    identity = _identity(outer)
    if identity is None:
        return False
    return identity in {_identity(p) for p in _existing_parents(inner)} - {_identity(inner)}


def _existing_parents(path: Path) -> Iterable[Path]:
    return (p for p in [path, *path.parents] if p.exists())


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino
