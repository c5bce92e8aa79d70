"""What a frame extraction is asked to do: the sampling strategy and its parameters, the image
format, and the bounds; `ExtractionOptions.profile_id` names the frames they produce."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from dataminer_dagster.core.images import IMAGE_FORMATS

Strategy = Literal["interval", "time", "scene"]
STRATEGIES: tuple[str, ...] = ("interval", "time", "scene")

# Part of every profile_id: bump it when a change here changes the frames written for the same
# options, so that new extractions land in new directories. 2: rotated videos' frames are stored
# upright (the frames of version 1 are sideways).
ALGORITHM_VERSION = 2
DEFAULT_MAX_FRAMES = 10_000  # frames kept per video unless the options say otherwise
DEFAULT_MAX_FRAME_PIXELS = 7680 * 4320  # 8K UHD; larger frames are refused, not decoded
# Frames with a side below this are refused, and no downscale goes below it: YOLO's coarsest
# stride is 32 pixels (a smaller picture has no cell at that scale), and the filter's model would
# see a 1x1 frame as one colour stretched to its input (its processor cannot even tell the
# channels of a 1x1 picture from its rows).
MIN_FRAME_SIDE = 32


@dataclass(frozen=True)
class ExtractionOptions:
    strategy: Strategy
    every_frames: int | None = None  # interval: keep every Nth decoded frame
    every_seconds: float | None = None  # time: one frame per this many seconds of stream time
    scene_threshold: float = 27.0  # scene: mean abs HSV difference (0-255) that makes a cut
    min_scene_seconds: float = 0.5  # scene: no cut closer than this to the previous one
    max_frames: int | None = DEFAULT_MAX_FRAMES  # caps the frames kept, never those looked at
    image_format: Literal["jpg", "png", "webp"] = "jpg"
    quality: int = 95  # jpg and webp, 1-100
    max_side: int | None = None  # downscale so that the longest side is at most this
    # Refuses larger videos; never changes the frames written, so it is not part of profile_id.
    max_frame_pixels: int | None = DEFAULT_MAX_FRAME_PIXELS

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of interval, time, scene; got {self.strategy!r}"
            )
        if self.strategy == "interval" and (self.every_frames is None or self.every_frames < 1):
            raise ValueError(
                f"strategy 'interval' needs every_frames >= 1, got {self.every_frames!r}"
            )
        if self.strategy == "time" and (self.every_seconds is None or self.every_seconds <= 0):
            raise ValueError(f"strategy 'time' needs every_seconds > 0, got {self.every_seconds!r}")
        if not 0 < self.scene_threshold <= 255:
            raise ValueError(f"scene_threshold must be in (0, 255], got {self.scene_threshold!r}")
        if self.min_scene_seconds < 0:
            raise ValueError(f"min_scene_seconds must be >= 0, got {self.min_scene_seconds!r}")
        if self.max_frames is not None and self.max_frames < 1:
            raise ValueError(f"max_frames must be >= 1 or None, got {self.max_frames!r}")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(
                f"image_format must be one of jpg, png, webp; got {self.image_format!r}"
            )
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be between 1 and 100, got {self.quality!r}")
        if self.max_side is not None and self.max_side < 1:
            raise ValueError(f"max_side must be >= 1 or None, got {self.max_side!r}")
        if self.max_frame_pixels is not None and self.max_frame_pixels < 1:
            raise ValueError(
                f"max_frame_pixels must be >= 1 or None, got {self.max_frame_pixels!r}"
            )

    def profile_id(self) -> str:
        """Short stable hash of the options that change the output; names output directories."""
        sampling = {
            "interval": {"every_frames": self.every_frames},
            "time": {"every_seconds": float(self.every_seconds or 0)},
            "scene": {
                "scene_threshold": float(self.scene_threshold),
                "min_scene_seconds": float(self.min_scene_seconds),
            },
        }[self.strategy]
        profile = {
            "version": ALGORITHM_VERSION,
            "strategy": self.strategy,
            **sampling,
            "max_frames": self.max_frames,
            "image_format": self.image_format,
            "quality": None if self.image_format == "png" else self.quality,
            "max_side": self.max_side,
        }
        return hashlib.sha256(json.dumps(profile, sort_keys=True).encode()).hexdigest()[:12]
