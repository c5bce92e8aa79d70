"""Choosing the frames to keep, by strategy: every Nth frame (interval), the first frame at or
after each step of a time grid (time), or the first frame of each scene (scene).

For interval and time sampling the target frames are known up front from the timeline, so the
decoder can seek past the frames between them; scene detection has to look at every frame.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from dataminer_dagster.assets.frames.extraction_options import ExtractionOptions
from dataminer_dagster.assets.frames.frame_decoding import DecodeStats, ProgressReporter, decode
from dataminer_dagster.assets.frames.frame_timeline import FrameTimeline

if TYPE_CHECKING:
    import av

# Scene detection compares frames scaled to this width (aspect kept), as PySceneDetect does.
SCENE_WIDTH = 160
TIME_EPSILON = 1e-6  # seconds; float slack when comparing timestamps with a time grid


def kept_frames(
    container: av.container.InputContainer,
    stream: av.VideoStream,
    timeline: FrameTimeline | None,
    options: ExtractionOptions,
    fps: float | None,
    stats: DecodeStats,
    progress: ProgressReporter,
) -> Iterator[tuple[int, float, av.VideoFrame]]:
    """(index, timestamp, frame) for each frame to keep, in stream order."""
    if options.strategy != "scene" and timeline is not None:
        targets = _plan_targets(options, timeline)
        yield from decode(container, stream, timeline, targets, fps, stats, progress)
        return
    if options.strategy == "scene":
        detector = _SceneDetector(options.scene_threshold, options.min_scene_seconds)

        def keep(index: int, timestamp: float, frame: av.VideoFrame) -> bool:
            return detector.is_scene_start(frame, timestamp)

    else:
        sampler = _sampler(options)

        def keep(index: int, timestamp: float, frame: av.VideoFrame) -> bool:
            return sampler(index, timestamp)

    kept = 0
    for index, timestamp, frame in decode(container, stream, timeline, None, fps, stats, progress):
        if keep(index, timestamp, frame):
            yield index, timestamp, frame
            kept += 1
            if kept == options.max_frames:
                return


def _sampler(options: ExtractionOptions) -> Callable[[int, float], bool]:
    """Interval or time sampling as a yes/no question asked of each frame in order."""
    if options.strategy == "interval":
        every = options.every_frames
        return lambda index, _timestamp: index % every == 0
    every_seconds = options.every_seconds
    next_time = 0.0

    def first_frame_at_or_after_each_grid_time(_index: int, timestamp: float) -> bool:
        # Frames at or after k * every_seconds, one per k; a gap in a variable-rate stream
        # skips the grid times it spans instead of keeping a burst of frames after it.
        nonlocal next_time
        if timestamp + TIME_EPSILON < next_time:
            return False
        next_time = (math.floor((timestamp + TIME_EPSILON) / every_seconds) + 1) * every_seconds
        return True

    return first_frame_at_or_after_each_grid_time


def _plan_targets(options: ExtractionOptions, timeline: FrameTimeline) -> list[int]:
    sampler = _sampler(options)
    targets = (i for i in range(len(timeline.pts)) if sampler(i, timeline.seconds(i)))
    return list(itertools.islice(targets, options.max_frames))


class _SceneDetector:
    """Content-change detector in the spirit of PySceneDetect's ContentDetector.

    The score is the mean absolute difference of consecutive frames in HSV (0-255 scale, hue
    0-179 as OpenCV stores it), each frame scaled to SCENE_WIDTH so that noise averages out and
    the threshold does not depend on the resolution.
    """

    def __init__(self, threshold: float, min_scene_seconds: float):
        self.threshold = threshold
        self.min_scene_seconds = min_scene_seconds
        self.previous: np.ndarray | None = None
        self.last_start: float | None = None

    def is_scene_start(self, frame: av.VideoFrame, timestamp: float) -> bool:
        import cv2

        width = min(SCENE_WIDTH, frame.width)
        height = max(1, round(frame.height * width / frame.width))
        small = frame.to_ndarray(format="bgr24", width=width, height=height, interpolation="AREA")
        hsv = cv2.cvtColor(small, cv2.COLOR_BGR2HSV)
        previous, self.previous = self.previous, hsv
        if self.last_start is None:
            self.last_start = timestamp
            return True
        score = sum(cv2.mean(cv2.absdiff(hsv, previous))[:3]) / 3
        if score >= self.threshold and timestamp - self.last_start >= self.min_scene_seconds:
            self.last_start = timestamp
            return True
        return False
