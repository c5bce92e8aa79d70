"""Where files live. Paths stored in the database are relative to the data directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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

    def filter_table(self, video_id: str) -> Path:
        return self.root / "filter" / f"{video_id}.parquet"

    @property
    def dedup_table(self) -> Path:
        return self.root / "dedup" / "frames.parquet"

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
