"""Decoding the frames of a video in stream order, all of them or only chosen ones: with a list of
target frames the decoder seeks ahead to the keyframe before the next target instead of decoding
forward, and stops after the last. Progress is reported as the fraction of the video decoded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dataminer_dagster.assets.frames.frame_timeline import FrameTimeline

if TYPE_CHECKING:
    import av

# After a seek the frame-threaded decoder refills its pipeline (about a frame per thread), so a
# seek pays only when it skips clearly more; one second of frames leaves a wide margin.
SEEK_MIN_SKIP_SECONDS = 1.0
FALLBACK_FPS = 30.0  # only to size the seek margin when a stream states no rate at all
PROGRESS_STEP = 0.01


@dataclass
class DecodeStats:
    frames_decoded: int = 0
    last_time: float = 0.0
    missed: int = 0  # target frames the decoder never produced


def decode(
    container: av.container.InputContainer,
    stream: av.VideoStream,
    timeline: FrameTimeline | None,
    targets: list[int] | None,
    fps: float | None,
    stats: DecodeStats,
    progress: ProgressReporter,
) -> Iterator[tuple[int, float, av.VideoFrame]]:
    """(index, timestamp, frame) for every frame, or only for `targets` (ascending indexes).

    With targets, seek to the keyframe before the next target whenever that keyframe lies more
    than SEEK_MIN_SKIP_SECONDS of frames ahead of the decoder, and stop after the last target.
    """
    pending = deque(targets) if targets is not None else None
    min_skip = round((fps or FALLBACK_FPS) * SEEK_MIN_SKIP_SECONDS)
    can_seek = timeline is not None and pending is not None
    frames = container.decode(stream)
    next_index = 0  # the index the decoder produces next, as far as we know
    sought: int | None = None  # the target we seeked for, until its first frame shows up
    while pending is None or pending:
        if can_seek:
            start = timeline.keyframe_at_or_before(pending[0])
            if start - next_index > min_skip:
                container.seek(int(timeline.pts[start]), backward=True, stream=stream)
                frames = container.decode(stream)
                next_index, sought = start, pending[0]
        frame = next(frames, None)
        if frame is None:
            break
        stats.frames_decoded += 1
        index = _frame_index(frame, timeline, next_index)
        if sought is not None and index > sought:
            # The demuxer landed past the target: decode from the start, never seek again.
            container.seek(int(timeline.pts[0]), backward=True, stream=stream)
            frames = container.decode(stream)
            next_index, sought, can_seek = 0, None, False
            continue
        sought = None
        next_index = index + 1
        timestamp = _frame_seconds(frame, index, timeline, fps)
        stats.last_time = timestamp
        progress.update(timestamp)
        if pending is None:
            yield index, timestamp, frame
            continue
        while pending and pending[0] < index:
            pending.popleft()
            stats.missed += 1
        if pending and pending[0] == index:
            pending.popleft()
            yield index, timestamp, frame
    if pending:
        stats.missed += len(pending)


def _frame_index(frame: av.VideoFrame, timeline: FrameTimeline | None, counted: int) -> int:
    if timeline is not None and frame.pts is not None:
        index = timeline.index_of(frame.pts)
        if index is not None:
            return index
    return counted


def _frame_seconds(
    frame: av.VideoFrame, index: int, timeline: FrameTimeline | None, fps: float | None
) -> float:
    if timeline is not None and index < len(timeline.pts):
        return timeline.seconds(index)
    if frame.time is not None:
        return float(frame.time)
    return index / fps if fps else 0.0


class ProgressReporter:
    """Calls `callback(fraction)` each time decoding advances by PROGRESS_STEP of the video."""

    def __init__(self, callback: Callable[[float], None] | None, duration: float | None):
        self.callback = callback
        self.duration = duration
        self.reported = 0.0

    def update(self, timestamp: float) -> None:
        if self.callback is None or not self.duration:
            return
        fraction = min(1.0, timestamp / self.duration)
        if fraction >= self.reported + PROGRESS_STEP:
            self.reported = fraction
            self.callback(fraction)

    def finish(self) -> None:
        if self.callback is not None:
            self.callback(1.0)
