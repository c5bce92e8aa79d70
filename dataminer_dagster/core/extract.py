"""Frame extraction: sample frames from a video by frame interval, by time or at scene cuts.

Pure: no Dagster, no SQL. Decoding is the cost floor, so the work is arranged around it:

* A first pass over the packets (demuxing only, no decoding; ~60 ms for a 120 MB file) lists
  every frame's presentation timestamp and the keyframes, in NumPy arrays (8 bytes a frame, so
  a day-long stream costs megabytes, not a Python object per frame). Frame indexes and
  timestamps therefore come from the stream, not from fps arithmetic: right for variable frame
  rates, for 29.97 fps, and for WebM, whose header has no frame count.
* Bounded by default: at most DEFAULT_MAX_FRAMES frames kept, and a video whose frames exceed
  DEFAULT_MAX_FRAME_PIXELS is refused before anything is decoded (options can raise both).
* Decoding uses frame threading. Frames that are dropped are never converted or encoded.
* For interval and time sampling the target frames are known up front; when the keyframe before
  the next target lies well ahead of the decoder, we seek to it instead of decoding forward.
* Kept frames are converted, encoded and written on a small thread pool while decoding goes on.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from dataminer_dagster.core.images import IMAGE_FORMATS, encode_image, fit_within, sharpness
from dataminer_dagster.core.media import VideoDecodeError, ffmpeg_reason

if TYPE_CHECKING:
    import av

Strategy = Literal["interval", "time", "scene"]
STRATEGIES: tuple[str, ...] = ("interval", "time", "scene")

# Part of every profile_id: bump it when a change here changes the frames written for the same
# options, so that new extractions land in new directories.
ALGORITHM_VERSION = 1
# Scene detection compares frames scaled to this width (aspect kept), as PySceneDetect does.
SCENE_WIDTH = 160
# After a seek the frame-threaded decoder refills its pipeline (about a frame per thread), so a
# seek pays only when it skips clearly more; one second of frames leaves a wide margin.
SEEK_MIN_SKIP_SECONDS = 1.0
FALLBACK_FPS = 30.0  # only to size the seek margin when a stream states no rate at all
WRITER_THREADS = 2
WRITER_QUEUE = 6  # kept frames in flight at most, which bounds memory
TIME_EPSILON = 1e-6  # seconds; float slack when comparing timestamps with a time grid
PROGRESS_STEP = 0.01
DEFAULT_MAX_FRAMES = 10_000  # frames kept per video unless the options say otherwise
DEFAULT_MAX_FRAME_PIXELS = 7680 * 4320  # 8K UHD; larger frames are refused, not decoded

MANIFEST_COLUMNS = (
    "frame_index",
    "timestamp",
    "file_name",
    "width",
    "height",
    "sharpness",
    "content_hash",
)


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


@dataclass(frozen=True)
class ExtractedFrame:
    index: int  # decoded frame index in the stream (presentation order)
    timestamp: float  # seconds from the first frame, from pts * time_base
    file_name: str  # f"{prefix}_{index:06d}.{ext}" inside out_dir
    width: int
    height: int
    sharpness: float  # variance of the Laplacian at a fixed scale; higher is sharper
    content_hash: str  # hex digest of the encoded image bytes


@dataclass(frozen=True)
class ExtractionResult:
    frames: list[ExtractedFrame]
    fps: float | None
    duration: float | None  # seconds, as the file declares it (or as found when it does not)
    frames_decoded: int  # frames the decoder produced, kept or not
    seconds: float  # wall time of the extraction
    warnings: list[str]
    frame_count: int | None = None  # frames in the stream, counted from its packets


def frame_file_name(prefix: str, index: int, image_format: str) -> str:
    return f"{prefix}_{index:06d}.{image_format}"


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
    `max_frame_pixels`, and when no frame is kept. Corrupt data after some frames were kept ends
    the extraction with a warning instead.
    """
    import av

    started = time.perf_counter()
    video_path, out_dir = Path(video_path), Path(out_dir)
    _check_file(video_path)
    with _open_video(video_path) as container:
        stream = container.streams.video[0]
        _check_frame_size(
            stream.codec_context.width, stream.codec_context.height, options, video_path
        )
        timeline, warnings = _read_timeline(container, stream, video_path)
    stats = _DecodeStats()
    with _open_video(video_path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        fps, duration = _stream_rate(stream, timeline), _declared_duration(container, stream)
        reporter = _ProgressReporter(progress, timeline.end if timeline else duration)
        with _FrameWriter(out_dir, prefix, options) as writer:
            kept = _kept_frames(container, stream, timeline, options, fps, stats, reporter)
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


def write_manifest(result: ExtractionResult, path: Path) -> None:
    """One Parquet row per kept frame: frame_index, timestamp, file_name, width, height, ..."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema(
        [
            ("frame_index", pa.int64()),
            ("timestamp", pa.float64()),
            ("file_name", pa.string()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("sharpness", pa.float64()),
            ("content_hash", pa.string()),
        ]
    )
    columns = {
        "frame_index": [f.index for f in result.frames],
        "timestamp": [f.timestamp for f in result.frames],
        "file_name": [f.file_name for f in result.frames],
        "width": [f.width for f in result.frames],
        "height": [f.height for f in result.frames],
        "sharpness": [f.sharpness for f in result.frames],
        "content_hash": [f.content_hash for f in result.frames],
    }
    pq.write_table(pa.table(columns, schema=schema), Path(path))


def read_manifest(path: Path) -> list[ExtractedFrame]:
    import pyarrow.parquet as pq

    table = pq.read_table(Path(path))
    missing = [c for c in MANIFEST_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"Frame manifest {path} lacks the columns {', '.join(missing)}")
    rows = table.select(list(MANIFEST_COLUMNS)).to_pylist()
    return [
        ExtractedFrame(
            index=row["frame_index"],
            timestamp=row["timestamp"],
            file_name=row["file_name"],
            width=row["width"],
            height=row["height"],
            sharpness=row["sharpness"],
            content_hash=row["content_hash"],
        )
        for row in rows
    ]


# Opening and the packet pass ---------------------------------------------------------------


@dataclass(frozen=True)
class _Timeline:
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


def _check_frame_size(width: int, height: int, options: ExtractionOptions, path: Path) -> None:
    limit = options.max_frame_pixels
    if limit is not None and width * height > limit:
        raise VideoDecodeError(
            path,
            f"its frames are {width}x{height} ({width * height:,} pixels), over the limit of "
            f"{limit:,} pixels (max_frame_pixels); raise the limit to extract it",
        )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise VideoDecodeError(path, "file not found")
    if not path.is_file():
        raise VideoDecodeError(path, "not a regular file")
    if path.stat().st_size == 0:
        raise VideoDecodeError(path, "file is empty (0 bytes)")


def _open_video(path: Path) -> av.container.InputContainer:
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


def _read_timeline(
    container: av.container.InputContainer, stream: av.VideoStream, path: Path
) -> tuple[_Timeline | None, list[str]]:
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
    timeline = _Timeline(
        pts=ordered,
        keyframes=np.searchsorted(ordered, keyframes),
        time_base=Fraction(stream.time_base),
    )
    declared = _declared_duration(container, stream)
    if not warnings and declared and declared - timeline.end > max(1.0, 0.05 * declared):
        warnings.append(
            f"the file holds frames up to t={timeline.end:.2f}s of the {declared:.2f}s it "
            "declares; it may be truncated"
        )
    return timeline, warnings


def _declared_duration(
    container: av.container.InputContainer, stream: av.VideoStream
) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    return None


def _stream_rate(stream: av.VideoStream, timeline: _Timeline | None) -> float | None:
    rate = stream.average_rate or stream.base_rate
    if rate:
        return float(rate)
    if timeline and len(timeline.pts) > 1 and timeline.end > 0:
        return len(timeline.pts) / timeline.end
    return None


# Choosing frames ---------------------------------------------------------------------------


@dataclass
class _DecodeStats:
    frames_decoded: int = 0
    last_time: float = 0.0
    missed: int = 0  # target frames the decoder never produced


def _kept_frames(
    container: av.container.InputContainer,
    stream: av.VideoStream,
    timeline: _Timeline | None,
    options: ExtractionOptions,
    fps: float | None,
    stats: _DecodeStats,
    progress: _ProgressReporter,
) -> Iterator[tuple[int, float, av.VideoFrame]]:
    """(index, timestamp, frame) for each frame to keep, in stream order."""
    if options.strategy != "scene" and timeline is not None:
        targets = _plan_targets(options, timeline)
        yield from _decode(container, stream, timeline, targets, fps, stats, progress)
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
    for index, timestamp, frame in _decode(container, stream, timeline, None, fps, stats, progress):
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


def _plan_targets(options: ExtractionOptions, timeline: _Timeline) -> list[int]:
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


# Decoding ----------------------------------------------------------------------------------


def _decode(
    container: av.container.InputContainer,
    stream: av.VideoStream,
    timeline: _Timeline | None,
    targets: list[int] | None,
    fps: float | None,
    stats: _DecodeStats,
    progress: _ProgressReporter,
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


def _frame_index(frame: av.VideoFrame, timeline: _Timeline | None, counted: int) -> int:
    if timeline is not None and frame.pts is not None:
        index = timeline.index_of(frame.pts)
        if index is not None:
            return index
    return counted


def _frame_seconds(
    frame: av.VideoFrame, index: int, timeline: _Timeline | None, fps: float | None
) -> float:
    if timeline is not None and index < len(timeline.pts):
        return timeline.seconds(index)
    if frame.time is not None:
        return float(frame.time)
    return index / fps if fps else 0.0


class _ProgressReporter:
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


# Writing -----------------------------------------------------------------------------------


class _FrameWriter:
    """Converts, encodes and writes kept frames on a small thread pool while decoding goes on.

    Decoded frames own their buffers, so they can be handed to another thread; swscale and the
    OpenCV encoders release the GIL, so the pool overlaps with the decoder.
    """

    def __init__(self, out_dir: Path, prefix: str, options: ExtractionOptions):
        self.out_dir = out_dir
        self.prefix = prefix
        self.options = options
        self.submitted = 0
        self._pool = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="extract-write")
        self._in_flight: deque[Future[ExtractedFrame]] = deque()
        self._written: list[ExtractedFrame] = []

    def __enter__(self) -> _FrameWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(self, index: int, timestamp: float, frame: av.VideoFrame) -> None:
        if len(self._in_flight) >= WRITER_QUEUE:
            self._written.append(self._in_flight.popleft().result())
        self._in_flight.append(self._pool.submit(self._write, index, timestamp, frame))
        self.submitted += 1

    def finish(self) -> list[ExtractedFrame]:
        while self._in_flight:
            self._written.append(self._in_flight.popleft().result())
        return self._written

    def _write(self, index: int, timestamp: float, frame: av.VideoFrame) -> ExtractedFrame:
        options = self.options
        width, height = fit_within(frame.width, frame.height, options.max_side)
        if (width, height) == (frame.width, frame.height):
            image = frame.to_ndarray(format="bgr24")
        else:
            image = frame.to_ndarray(
                format="bgr24", width=width, height=height, interpolation="AREA"
            )
        data = encode_image(image, options.image_format, quality=options.quality)
        file_name = frame_file_name(self.prefix, index, options.image_format)
        (self.out_dir / file_name).write_bytes(data)
        return ExtractedFrame(
            index=index,
            timestamp=timestamp,
            file_name=file_name,
            width=width,
            height=height,
            sharpness=sharpness(image),
            content_hash=hashlib.blake2b(data, digest_size=16).hexdigest(),
        )
