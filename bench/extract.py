"""Benchmark frame extraction against plain decoding and the reference system's extractor.

On a synthetic 1280x720, 60 s, 30 fps H.264 file (libx264 CRF 23, one slice per frame, made once
and cached in bench/results/), each repeat runs, interleaved so that load from other processes
hits all methods alike:

  (a)  plain decode, no output: PyAV with frame threading (and OpenCV grab() for comparison)
  (b)  the reference system's method (spec section 4.2), reimplemented here only: PyAV with
       default settings decodes every frame from the start up to the last target, targets go
       through PIL and are saved as JPEG quality 95 with optimize=True
  (c)  ours: assets.frames.frame_extraction.extract_frames, strategy "time", jpg quality 95

for dense sampling (1 frame per second) and sparse sampling (1 frame per 10 s), and prints the
medians of wall and CPU seconds with the ratios (c)/(a) and (b)/(c). It exits non-zero if (b)
and (c) keep different frame indexes.

    /work/venv/bin/python bench/extract.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av
import cv2

from dataminer_dagster.assets.frames.extraction_options import ExtractionOptions
from dataminer_dagster.assets.frames.frame_extraction import extract_frames
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_h264_video

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DENSE_SECONDS = 1.0
SPARSE_SECONDS = 10.0
GOALS = {
    "dense": "(c)/(a) <= 1.3 and (b)/(c) >= 1.5",
    "sparse": "(c)/(a) <= 0.6",
}


def benchmark_video(spec: SyntheticVideoSpec, crf: int) -> Path:
    """The cached benchmark file, written once (atomically) when missing."""
    name = (
        f"synthetic_{spec.width}x{spec.height}_{spec.seconds:g}s_{spec.fps:g}fps_crf{crf}"
        f"_noise{spec.noise}.mp4"
    )
    path = RESULTS_DIR / name
    if not path.exists():
        print(f"writing {path} (once; a few minutes on 2 cores)", file=sys.stderr)
        partial = path.with_suffix(".partial.mp4")
        write_h264_video(partial, spec, crf=crf)
        partial.rename(path)
    return path


def plain_decode_pyav(video: Path) -> int:
    """(a) The fastest decode with no output: PyAV with frame threading."""
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return sum(1 for _ in container.decode(stream))


def plain_decode_opencv(video: Path) -> int:
    """(a') OpenCV's FFmpeg backend, grab() only (decodes, no conversion)."""
    capture = cv2.VideoCapture(str(video))
    count = 0
    while capture.grab():
        count += 1
    capture.release()
    return count


def reference_extract(video: Path, out_dir: Path, every_seconds: float) -> list[int]:
    """(b) The reference FrameExtractor's "time" strategy, as the spec (section 4.2) describes."""
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        total = stream.frames or 10000
        fps = float(stream.average_rate or stream.base_rate or 30)
        step = max(1, int(fps * every_seconds))
        wanted = set(range(0, total, step))
        last = max(wanted)
        kept = []
        for frame_index, frame in enumerate(container.decode(video=0)):
            if frame_index > last:
                break
            if frame_index in wanted:
                path = out_dir / f"ref_{frame_index:06d}.jpg"
                frame.to_image().save(path, "JPEG", quality=95, optimize=True)
                kept.append(frame_index)
    return kept


def our_extract(video: Path, out_dir: Path, every_seconds: float) -> list[int]:
    """(c) Ours."""
    options = ExtractionOptions(strategy="time", every_seconds=every_seconds, quality=95)
    result = extract_frames(video, out_dir, prefix="bench", options=options)
    return [frame.index for frame in result.frames]


def timed(run: Callable[[], object]) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process over all threads, result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def run_benchmark(
    video: Path, repeats: int, with_opencv: bool
) -> tuple[dict[str, dict[str, list[float]]], dict[str, int]]:
    """Wall and CPU seconds of every run per method, and the frames kept per sampling case."""
    methods: dict[str, Callable[[Path], object]] = {"a": lambda _out: plain_decode_pyav(video)}
    if with_opencv:
        methods["a_opencv"] = lambda _out: plain_decode_opencv(video)
    for case, seconds in (("dense", DENSE_SECONDS), ("sparse", SPARSE_SECONDS)):
        methods[f"b_{case}"] = lambda out, s=seconds: reference_extract(video, out, s)
        methods[f"c_{case}"] = lambda out, s=seconds: our_extract(video, out, s)
    samples: dict[str, dict[str, list[float]]] = {
        "wall": {name: [] for name in methods},
        "cpu": {name: [] for name in methods},
    }
    outputs: dict[str, object] = {}
    for repeat in range(repeats):
        for name, method in methods.items():
            out_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=RESULTS_DIR))
            try:
                wall, cpu, outputs[name] = timed(lambda m=method, o=out_dir: m(o))
            finally:
                shutil.rmtree(out_dir)
            samples["wall"][name].append(wall)
            samples["cpu"][name].append(cpu)
        print(f"repeat {repeat + 1}/{repeats} done", file=sys.stderr)
    for case in ("dense", "sparse"):
        if outputs[f"b_{case}"] != outputs[f"c_{case}"]:
            raise SystemExit(
                f"{case}: frame indexes differ: reference {outputs[f'b_{case}']}, "
                f"ours {outputs[f'c_{case}']}"
            )
    kept = {case: len(outputs[f"c_{case}"]) for case in ("dense", "sparse")}
    return samples, kept


def table(runs: dict[str, list[float]], kept: dict[str, int], unit: str, goals: bool) -> str:
    """Markdown table: median seconds (min-max over repeats) per method, ratios of medians."""
    median = {name: statistics.median(values) for name, values in runs.items()}

    def cell(name: str) -> str:
        return f"{median[name]:.2f} ({min(runs[name]):.2f}-{max(runs[name]):.2f})"

    with_opencv = "a_opencv" in runs
    lines = [
        f"| sampling | frames kept | (a) PyAV decode, {unit} | "
        + (f"(a') OpenCV grab, {unit} | " if with_opencv else "")
        + f"(b) reference, {unit} | (c) ours, {unit} | (c)/(a) | (b)/(c) |"
        + (" goal (wall) |" if goals else ""),
        "|---|---:|---:|"
        + ("---:|" if with_opencv else "")
        + "---:|---:|---:|---:|"
        + ("---|" if goals else ""),
    ]
    for case, label in (("dense", "1 frame / 1 s"), ("sparse", "1 frame / 10 s")):
        a, b, c = median["a"], median[f"b_{case}"], median[f"c_{case}"]
        opencv = f"{cell('a_opencv')} | " if with_opencv else ""
        lines.append(
            f"| {label} | {kept[case]} | {cell('a')} | {opencv}{cell(f'b_{case}')} | "
            f"{cell(f'c_{case}')} | {c / a:.2f} | {b / c:.2f} |"
            + (f" {GOALS[case]} |" if goals else "")
        )
    return "\n".join(lines)


def conditions() -> str:
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return (
        f"{cpu_model or platform.processor()}, {os.cpu_count()} cores, load average {load}; "
        f"Python {platform.python_version()}, PyAV {av.__version__} "
        f"(FFmpeg {av.library_versions['libavcodec']} libavcodec), OpenCV {cv2.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per method (default 5)")
    parser.add_argument("--seconds", type=float, default=60.0, help="video length (default 60)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--crf", type=int, default=23)
    parser.add_argument(
        "--noise",
        type=int,
        default=4,
        help="per-pixel noise amplitude (default 4: about 4 Mbit/s, a YouTube-like 720p bitrate; "
        "12 gives about 16 Mbit/s, where decoding dwarfs everything else)",
    )
    parser.add_argument(
        "--no-opencv", action="store_true", help="skip the OpenCV grab() decode baseline"
    )
    args = parser.parse_args()

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    spec = SyntheticVideoSpec(
        width=args.width, height=args.height, fps=args.fps, seconds=args.seconds, noise=args.noise
    )
    video = benchmark_video(spec, args.crf)
    before = conditions()
    samples, kept = run_benchmark(video, args.repeats, with_opencv=not args.no_opencv)
    print(f"video: {video.name} ({video.stat().st_size / 1e6:.0f} MB), {args.repeats} repeats")
    print(f"before: {before}")
    print(f"after:  {conditions()}")
    print("frame indexes of (b) and (c) match in both cases")
    print()
    print("Wall seconds, median (min-max):")
    print()
    print(table(samples["wall"], kept, "s", goals=True))
    print()
    print("CPU seconds of the process (all threads), median (min-max):")
    print()
    print(table(samples["cpu"], kept, "CPU s", goals=False))


if __name__ == "__main__":
    main()
