"""The frames stage's config (`extract:` in the project YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from dataminer_dagster.assets.frames.extraction_options import (
    DEFAULT_MAX_FRAME_PIXELS,
    DEFAULT_MAX_FRAMES,
    MIN_FRAME_SIDE,
)
from dataminer_dagster.core.config_section import Section


class ExtractConfig(Section):
    strategy: Literal["interval", "time", "scene"] = Field(
        "time",
        description="interval: every Nth frame; time: one frame per every_seconds; scene: first frame of each scene.",
    )
    every_frames: int = Field(30, ge=1, description="interval: frames between samples.")
    every_seconds: float = Field(1.0, gt=0, description="time: seconds between samples.")
    scene_threshold: float = Field(
        27.0, gt=0, le=255, description="scene: content change (0-255) that starts a new scene."
    )
    max_frames: int = Field(DEFAULT_MAX_FRAMES, ge=1, description="Most frames kept per video.")
    image_format: Literal["jpg", "png", "webp"] = Field(
        "jpg", description="Format of the extracted frames."
    )
    quality: int = Field(95, ge=1, le=100, description="JPEG/WebP quality.")
    max_side: int | None = Field(
        None,
        ge=MIN_FRAME_SIDE,
        description="Downscale frames so the longest side is at most this.",
    )
    max_frame_pixels: int = Field(
        DEFAULT_MAX_FRAME_PIXELS,
        ge=1,
        description="Videos with larger frames (width x height) are refused, not decoded; default 8K.",
    )
    min_free_disk_mb: float = Field(
        1024,
        ge=0,
        description="Free space required on the data disk before extracting; else it waits.",
    )

    def results_view(self) -> dict[str, str]:
        """The frames depend on the extraction profile alone (options of another strategy, the
        disk reserve and the size cap change nothing in them)."""
        return {"profile": self.options().profile_id()}

    def options(self):
        """This section's `ExtractionOptions` (assets.frames.extraction_options): the profile a video's
        frames are made with."""
        from dataminer_dagster.assets.frames.extraction_options import ExtractionOptions

        return ExtractionOptions(
            strategy=self.strategy,
            every_frames=self.every_frames if self.strategy == "interval" else None,
            every_seconds=self.every_seconds if self.strategy == "time" else None,
            scene_threshold=self.scene_threshold,
            max_frames=self.max_frames,
            image_format=self.image_format,
            quality=self.quality,
            max_side=self.max_side,
            max_frame_pixels=self.max_frame_pixels,
        )
