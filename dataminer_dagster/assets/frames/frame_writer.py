"""Writing the kept frames: each is converted (downscaled if asked), turned upright, encoded and
written to disk on a small thread pool while decoding goes on, and described as an
`ExtractedFrame`.
"""

from __future__ import annotations

import hashlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dataminer_dagster.assets.frames.extraction_options import ExtractionOptions
from dataminer_dagster.core.frame_rotation import frame_rotation, turn_upright, upright_size
from dataminer_dagster.core.images import encode_image, fit_within, picture_measures

if TYPE_CHECKING:
    import av

WRITER_THREADS = 2
WRITER_QUEUE = 6  # kept frames in flight at most, which bounds memory


@dataclass(frozen=True)
class ExtractedFrame:
    index: int  # decoded frame index in the stream (presentation order)
    timestamp: float  # seconds from the first frame, from pts * time_base
    file_name: str  # f"{prefix}_{index:06d}.{ext}" inside out_dir
    width: int  # as stored: upright
    height: int
    sharpness: float  # variance of the Laplacian at a fixed scale; higher is sharper
    content_hash: str  # hex digest of the encoded image bytes
    rotation: int  # degrees clockwise the decoded picture was turned to be upright
    # mean grey level, 0-255; None for a frame extracted before extraction measured it
    brightness: float | None = None


def frame_file_name(prefix: str, index: int, image_format: str) -> str:
    return f"{prefix}_{index:06d}.{image_format}"


class FrameWriter:
    """Converts, encodes and writes kept frames on a small thread pool while decoding goes on.

    Decoded frames own their buffers, so they can be handed to another thread; swscale and the
    OpenCV encoders release the GIL, so the pool overlaps with the decoder.
    """

    def __init__(
        self, out_dir: Path, prefix: str, options: ExtractionOptions, *, tagged_rotation: int = 0
    ):
        """`tagged_rotation`: the stream's `rotate` tag, for frames without a display matrix."""
        self.out_dir = out_dir
        self.prefix = prefix
        self.options = options
        self.tagged_rotation = tagged_rotation
        self.submitted = 0
        self._pool = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="extract-write")
        self._in_flight: deque[Future[ExtractedFrame]] = deque()
        self._written: list[ExtractedFrame] = []

    def __enter__(self) -> FrameWriter:
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
        rotation = frame_rotation(frame, self.tagged_rotation)
        image = turn_upright(image, rotation)
        width, height = upright_size(width, height, rotation)
        data = encode_image(image, options.image_format, quality=options.quality)
        file_name = frame_file_name(self.prefix, index, options.image_format)
        (self.out_dir / file_name).write_bytes(data)
        sharpness, brightness = picture_measures(image)
        return ExtractedFrame(
            index=index,
            timestamp=timestamp,
            file_name=file_name,
            width=width,
            height=height,
            sharpness=sharpness,
            content_hash=hashlib.blake2b(data, digest_size=16).hexdigest(),
            rotation=rotation,
            brightness=brightness,
        )
