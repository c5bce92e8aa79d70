"""Probing video files: what a downloaded or local file holds, or a clear reason why it is unusable."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dataminer_dagster.core.frame_rotation import frame_rotation, tagged_rotation, upright_size
from dataminer_dagster.core.path_kinds import not_a_regular_file


class VideoDecodeError(Exception):
    """A video file that cannot be opened or decoded. The message names the file and the reason."""

    def __init__(self, path: Path, reason: str, *, video_id: str | None = None):
        self.path = Path(path)
        self.reason = reason
        name = video_id or self.path.stem
        super().__init__(f"Video {name} could not be decoded: {reason} (file {self.path})")


@dataclass(frozen=True)
class VideoProbe:
    duration: float | None  # seconds, None when the container does not say
    fps: float | None
    width: int  # as shown: upright (a phone's portrait video is taller than wide)
    height: int
    size_bytes: int


def probe_video(path: Path, *, video_id: str | None = None) -> VideoProbe:
    """Read the container header and decode the first frame; raise VideoDecodeError when unusable."""
    import av

    path = Path(path)
    if problem := not_a_regular_file(path):
        raise VideoDecodeError(path, problem, video_id=video_id)
    size = path.stat().st_size
    if size == 0:
        raise VideoDecodeError(path, "file is empty (0 bytes)", video_id=video_id)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoDecodeError(path, "no video stream in the file", video_id=video_id)
            stream = container.streams.video[0]
            first = next(container.decode(stream), None)
            if first is None:
                raise VideoDecodeError(path, "no frame could be decoded", video_id=video_id)
            width, height = upright_size(
                first.width, first.height, frame_rotation(first, tagged_rotation(stream))
            )
            rate = stream.average_rate or stream.base_rate
            duration = None
            if stream.duration is not None and stream.time_base is not None:
                duration = float(stream.duration * stream.time_base)
            elif container.duration is not None:
                duration = container.duration / 1_000_000
            return VideoProbe(
                duration=duration,
                fps=float(rate) if rate else None,
                width=width,
                height=height,
                size_bytes=size,
            )
    except VideoDecodeError:
        raise
    except (av.FFmpegError, StopIteration, ValueError) as exc:
        raise VideoDecodeError(path, ffmpeg_reason(exc), video_id=video_id) from exc


def ffmpeg_reason(exc: Exception) -> str:
    text = str(exc)
    # PyAV messages look like "[Errno 1094995529] Invalid data found when processing input: '/x.mp4'"
    if "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(": '")[0] or type(exc).__name__
