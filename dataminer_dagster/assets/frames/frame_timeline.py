"""Opening a video and the first pass over its packets (demuxing only, no decoding): the
`FrameTimeline` of every frame's presentation timestamp and of the keyframes, from which frame
indexes and timestamps are taken and seeks are planned.

NumPy arrays hold the timeline (8 bytes a frame, so a day-long stream costs megabytes, not a
Python object per frame), and because it comes from the stream rather than from fps arithmetic it
is right for variable frame rates, for 29.97 fps, and for WebM, whose header has no frame count.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dataminer_dagster.core.media import VideoDecodeError, ffmpeg_reason

if TYPE_CHECKING:
    import av


@dataclass(frozen=True)
class FrameTimeline:
    """Every frame's pts in presentation order (ascending, distinct), and the indexes of the
    keyframes (ascending): int64 arrays."""

    pts: np.ndarray
    keyframes: np.ndarray
    time_base: Fraction

    def seconds(self, index: int) -> float:
        # int * int / int: exact until the one rounding of the division, and fast (no Fraction).
        base = self.time_base
        return int(self.pts[index] - self.pts[0]) * base.numerator / base.denominator

    def index_of(self, pts: int) -> int | None:
        position = int(np.searchsorted(self.pts, pts))
        return position if position < len(self.pts) and self.pts[position] == pts else None

    @property
    def end(self) -> float:
        """Seconds from the first frame to the end of the last one (one mean frame past it)."""
        count = len(self.pts)
        last = self.seconds(count - 1)
        return last + last / (count - 1) if count > 1 else last

    def keyframe_at_or_before(self, index: int) -> int:
        position = int(np.searchsorted(self.keyframes, index, side="right")) - 1
        return int(self.keyframes[position]) if position >= 0 else 0


def open_video(path: Path) -> av.container.InputContainer:
    import av

    try:
        container = av.open(str(path))
    except av.InvalidDataError as exc:
        reason = f"{ffmpeg_reason(exc)}; the file is not a video or it is truncated"
        raise VideoDecodeError(path, reason) from exc
    except av.FFmpegError as exc:
        raise VideoDecodeError(path, ffmpeg_reason(exc)) from exc
    if not container.streams.video:
        container.close()
        raise VideoDecodeError(path, "no video stream in the file")
    return container


def read_timeline(
    container: av.container.InputContainer, stream: av.VideoStream, path: Path
) -> tuple[FrameTimeline | None, list[str]]:
    """The frame timeline from the packets, and warnings when the file looks cut short.

    None when packets lack timestamps or repeat them (raw streams, some AVI files): frames are
    then indexed by counting and nothing is seeked.
    """
    import av

    pts, keyframe_pts = array("q"), array("q")
    packets = 0
    usable = True
    try:
        for packet in container.demux(stream):
            if packet.size == 0:  # the empty packet that ends the stream
                continue
            packets += 1
            if packet.pts is None:
                usable = False
            elif not packet.is_discard:  # frames before an edit list's start are not shown
                pts.append(packet.pts)
                if packet.is_keyframe:
                    keyframe_pts.append(packet.pts)
    except av.FFmpegError:
        pass  # decoding reaches the same corrupt data and reports it where it stops
    if packets == 0:
        raise VideoDecodeError(path, "the video stream holds no frames")
    warnings = []
    if stream.frames and packets < stream.frames:
        warnings.append(
            f"the file holds {packets} of the {stream.frames} frames its header declares; "
            "it may be truncated"
        )
    ordered = np.sort(np.frombuffer(pts, dtype=np.int64))
    distinct = bool(np.all(np.diff(ordered) > 0))
    if not usable or not len(ordered) or not distinct or stream.time_base is None:
        return None, warnings
    keyframes = np.unique(np.frombuffer(keyframe_pts, dtype=np.int64))
    timeline = FrameTimeline(
        pts=ordered,
        keyframes=np.searchsorted(ordered, keyframes),
        time_base=Fraction(stream.time_base),
    )
    declared = declared_duration(container, stream)
    if not warnings and declared and declared - timeline.end > max(1.0, 0.05 * declared):
        warnings.append(
            f"the file holds frames up to t={timeline.end:.2f}s of the {declared:.2f}s it "
            "declares; it may be truncated"
        )
    return timeline, warnings


def declared_duration(
    container: av.container.InputContainer, stream: av.VideoStream
) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None


def stream_rate(stream: av.VideoStream, timeline: FrameTimeline | None) -> float | None:
    rate = stream.average_rate or stream.base_rate
    if rate:
        return float(rate)
    if timeline and len(timeline.pts) > 1 and timeline.end > 0:
        return len(timeline.pts) / timeline.end
    return None
