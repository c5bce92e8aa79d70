"""Frame extraction: sample frames from a video by frame interval, by time or at scene cuts.

Pure: no Dagster, no SQL. Decoding is the cost floor, so the work is arranged around it:

* A first pass over the packets (demuxing only, no decoding, so cheap beside a decode) lists
  every frame's presentation timestamp and the keyframes (`frame_timeline`). Frame indexes and
  timestamps therefore come from the stream, not from fps arithmetic.
* Bounded by default: at most DEFAULT_MAX_FRAMES frames kept, and a video whose frames exceed
  DEFAULT_MAX_FRAME_PIXELS is refused before anything is decoded (`extraction_options`; options
  can raise both).
* Decoding uses frame threading (`frame_decoding`). Frames that are dropped are never converted
  or encoded.
* For interval and time sampling the target frames are known up front (`frame_sampling`); when
  the keyframe before the next target lies well ahead of the decoder, we seek to it instead of
  decoding forward.
* Kept frames are converted, turned upright where the video says so (`frame_rotation`), encoded
  and written on a small thread pool while decoding goes on (`frame_writer`); `frame_manifest`
  lists them in a Parquet file.
* Frames smaller than MIN_FRAME_SIDE a side are refused as frames over the pixel cap are:
  nothing downstream can use them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dataminer_dagster.assets.frames.extraction_options import MIN_FRAME_SIDE, ExtractionOptions
from dataminer_dagster.assets.frames.frame_decoding import DecodeStats, ProgressReporter
from dataminer_dagster.assets.frames.frame_sampling import kept_frames
from dataminer_dagster.assets.frames.frame_timeline import (
    declared_duration,
    open_video,
    read_timeline,
    stream_rate,
)
from dataminer_dagster.assets.frames.frame_writer import ExtractedFrame, FrameWriter
from dataminer_dagster.core.frame_rotation import tagged_rotation
from dataminer_dagster.core.media import VideoDecodeError, ffmpeg_reason
from dataminer_dagster.core.path_kinds import not_a_regular_file


@dataclass(frozen=True)
class ExtractionResult:
    frames: list[ExtractedFrame]
    fps: float | None
    duration: float | None  # seconds, as the file declares it (or as found when it does not)
    frames_decoded: int  # frames the decoder produced, kept or not
    seconds: float  # wall time of the extraction
    warnings: list[str]
    frame_count: int | None = None  # frames in the stream, counted from its packets


def extract_frames(
    video_path: Path,
    out_dir: Path,
    *,
    prefix: str,
    options: ExtractionOptions,
    progress: Callable[[float], None] | None = None,
) -> ExtractionResult:
    """Write the sampled frames of `video_path` into `out_dir` (which the caller created).

    Raises VideoDecodeError for a missing, empty, non-video or undecodable file, for frames over
    `max_frame_pixels` or under MIN_FRAME_SIDE a side, and when no frame is kept. Corrupt data
    after some frames were kept ends the extraction with a warning instead.
    """
    import av

    started = time.perf_counter()
    video_path, out_dir = Path(video_path), Path(out_dir)
    _check_file(video_path)
    with open_video(video_path) as container:
        stream = container.streams.video[0]
        _check_frame_size(
            stream.codec_context.width, stream.codec_context.height, options, video_path
        )
        timeline, warnings = read_timeline(container, stream, video_path)
    stats = DecodeStats()
    with open_video(video_path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        fps, duration = stream_rate(stream, timeline), declared_duration(container, stream)
        reporter = ProgressReporter(progress, timeline.end if timeline else duration)
        rotation = tagged_rotation(stream)
        with FrameWriter(out_dir, prefix, options, tagged_rotation=rotation) as writer:
            kept = kept_frames(container, stream, timeline, options, fps, stats, reporter)
            try:
                for index, timestamp, frame in kept:
                    # The header may not state the size, or the stream may change it.
                    _check_frame_size(frame.width, frame.height, options, video_path)
                    writer.submit(index, timestamp, frame)
            except av.FFmpegError as exc:
                if writer.submitted == 0:
                    raise VideoDecodeError(video_path, ffmpeg_reason(exc)) from exc
                warnings.append(
                    f"decoding stopped early at t={stats.last_time:.2f}s because of corrupt data "
                    f"({ffmpeg_reason(exc)}); kept the {writer.submitted} frames sampled before"
                )
            frames = writer.finish()
    if stats.missed:
        warnings.append(f"{stats.missed} sampled frames could not be decoded and were skipped")
    if not frames:
        reason = "no frame could be decoded" if stats.frames_decoded == 0 else "no frame was kept"
        raise VideoDecodeError(video_path, reason)
    reporter.finish()
    return ExtractionResult(
        frames=frames,
        fps=fps,
        duration=duration if duration is not None else (timeline.end if timeline else None),
        frames_decoded=stats.frames_decoded,
        seconds=time.perf_counter() - started,
        warnings=warnings,
        frame_count=len(timeline.pts) if timeline else None,
    )


def _check_frame_size(width: int, height: int, options: ExtractionOptions, path: Path) -> None:
    if 0 < min(width, height) < MIN_FRAME_SIDE:  # 0: a header that does not state the size
        raise VideoDecodeError(
            path,
            f"its frames are {width}x{height}, smaller than {MIN_FRAME_SIDE} pixels a side; "
            "no filter or detector can use them",
        )
    limit = options.max_frame_pixels
    if limit is not None and width * height > limit:
        raise VideoDecodeError(
            path,
            f"its frames are {width}x{height} ({width * height:,} pixels), over the limit of "
            f"{limit:,} pixels (max_frame_pixels); raise the limit to extract it",
        )


def _check_file(path: Path) -> None:
    if problem := not_a_regular_file(path):
        raise VideoDecodeError(path, problem)
    if path.stat().st_size == 0:
        raise VideoDecodeError(path, "file is empty (0 bytes)")
