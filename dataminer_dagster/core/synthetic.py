"""Synthetic videos for tests, benchmarks and the offline demo.

Moving shapes over a background that changes colour at each scene cut, with per-frame noise so
that encoded frames and JPEGs have realistic sizes. Deterministic for a given seed. These clips
have no ground truth; `core.world` draws a world that has one (objects, boxes, junk scenes,
planted near-duplicates), to measure what the pipeline keeps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Distinct background colours (BGR); scene n uses PALETTE[n % len(PALETTE)].
PALETTE = [
    (40, 40, 40),
    (200, 60, 30),
    (30, 160, 60),
    (40, 60, 200),
    (180, 180, 40),
    (150, 40, 160),
]


@dataclass(frozen=True)
class SyntheticVideoSpec:
    width: int = 320
    height: int = 240
    fps: float = 30.0
    seconds: float = 4.0
    scene_cuts: Sequence[float] = field(default_factory=tuple)  # times (s) where the scene changes
    noise: int = 12  # amplitude of uniform per-pixel noise
    seed: int = 0

    @property
    def frame_count(self) -> int:
        return int(round(self.seconds * self.fps))


def synthetic_frames(spec: SyntheticVideoSpec) -> Iterator[np.ndarray]:
    """Yield BGR uint8 frames for `spec`."""
    import cv2

    rng = np.random.default_rng(spec.seed)
    h, w = spec.height, spec.width
    cuts = sorted(spec.scene_cuts)
    shapes = rng.uniform(0, 1, size=(6, 4))  # x, y, vx, vy in relative units
    noise_buffer = rng.integers(-spec.noise, spec.noise + 1, size=(8, h, w, 1), dtype=np.int16)
    for i in range(spec.frame_count):
        t = i / spec.fps
        scene = sum(1 for c in cuts if t >= c)
        frame = np.empty((h, w, 3), np.uint8)
        frame[:] = PALETTE[scene % len(PALETTE)]
        for k, (x, y, vx, vy) in enumerate(shapes):
            cx = int(((x + (vx - 0.5) * 0.4 * t) % 1.0) * w)
            cy = int(((y + (vy - 0.5) * 0.4 * t) % 1.0) * h)
            colour = PALETTE[(scene + k + 1) % len(PALETTE)]
            radius = max(4, min(h, w) // (6 + k))
            if k % 2:
                cv2.circle(frame, (cx, cy), radius, colour, -1)
            else:
                cv2.rectangle(
                    frame, (cx - radius, cy - radius), (cx + radius, cy + radius), colour, -1
                )
        cv2.putText(
            frame, f"{i:05d}", (8, h - 10), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 2
        )
        if spec.noise:
            noisy = frame.astype(np.int16) + noise_buffer[i % len(noise_buffer)]
            frame = np.clip(noisy, 0, 255).astype(np.uint8)
        yield frame


def write_opencv_video(path: Path, spec: SyntheticVideoSpec) -> Path:
    """Write with OpenCV: `.mp4` uses MPEG-4 Part 2 (mp4v), `.webm` uses VP8."""
    import cv2

    fourcc = {".mp4": "mp4v", ".webm": "VP80", ".avi": "MJPG"}[path.suffix.lower()]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(
        str(path), cv2.VideoWriter_fourcc(*fourcc), spec.fps, (spec.width, spec.height)
    )
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path.suffix} files on this machine")
    try:
        for frame in synthetic_frames(spec):
            writer.write(frame)
    finally:
        writer.release()
    return path


def write_scene_clips(directory: Path, count: int) -> list[Path]:
    """`count` six-second clips of 320x240 with two scene cuts and moving shapes (different per
    clip), as tests and benchmarks serve them; a clip already written is kept."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = directory / f"sample{i:02d}.mp4"
        if not path.is_file():
            spec = SyntheticVideoSpec(
                width=320, height=240, fps=15, seconds=6.0, scene_cuts=(2.0, 4.0), seed=i
            )
            write_opencv_video(path, spec)
        paths.append(path)
    return paths


def write_h264_video(
    path: Path, spec: SyntheticVideoSpec, *, crf: int = 23, gop: int | None = None
) -> Path:
    """Write H.264 (libx264 through PyAV) with one slice per frame, as camera/YouTube files are."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=int(round(spec.fps)))
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, "yuv420p"
        options = {"crf": str(crf), "slices": "1", "preset": "veryfast"}
        if gop:
            options["g"] = str(gop)
        stream.options = options
        for frame in synthetic_frames(spec):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path
