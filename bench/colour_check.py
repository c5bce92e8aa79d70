"""What dedup's colour check (dedup.colour_overlap) costs: a frame's histogram against decoding
the frame alone, and the overlap of many pairs.

Frames of the synthetic video generator (`core.synthetic`) at three sizes, saved as JPEG at the
extraction's default quality; per size, the median time of `core.images.read_image` (the decode
every reader of a frame pays, the baseline) and of `colour_check.colour_histogram` (the decode,
the scaling to 160 px and the histogram) over the frames, each repeated. Then
`ColourCheck.agree` over a million pairs of histograms, the check's cost per pair the search
reports. Last, a static shot (`--static-frames` frames of one video, every pair similar, their
colours alike) grouped by `grouping.deduplicate` without the check and with it, twice in turn
(the first run also pays for loading FAISS).

    python bench/colour_check.py [--frames 40] [--repeat 3] [--static-frames 10000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from dataminer_dagster.assets.dedup.colour_check import BINS, ColourCheck, colour_histogram
from dataminer_dagster.assets.dedup.grouping import deduplicate
from dataminer_dagster.core.images import read_image, write_image
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames

SIZES = {"640x360": (640, 360), "1280x720": (1280, 720), "1920x1080": (1920, 1080)}
JPEG_QUALITY = 95  # extract.quality's default
PAIRS = 1_000_000


def median_ms(function, paths: list[Path], repeat: int) -> float:
    """The median over `repeat` passes of the mean time per path, in milliseconds."""
    passes = []
    for _ in range(repeat):
        started = time.perf_counter()
        for path in paths:
            function(path)
        passes.append((time.perf_counter() - started) / len(paths) * 1000)
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=40, help="frames a size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--static-frames", type=int, default=10_000)
    args = parser.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load "
        f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}, OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE')}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    with tempfile.TemporaryDirectory(prefix="dm-colour-") as scratch:
        for name, (width, height) in SIZES.items():
            spec = SyntheticVideoSpec(
                width=width, height=height, fps=10, seconds=args.frames / 10, scene_cuts=(1.0,)
            )
            paths = []
            for number, frame in enumerate(synthetic_frames(spec)):
                path = Path(scratch) / f"{name}_{number:04d}.jpg"
                write_image(path, frame, quality=JPEG_QUALITY)
                paths.append(path)
            decode = median_ms(read_image, paths, args.repeat)
            histogram = median_ms(colour_histogram, paths, args.repeat)
            print(
                f"{name}: decode {decode:.2f} ms a frame, histogram (decode included) "
                f"{histogram:.2f} ms: {histogram / decode:.2f}x the decode"
            )
    rng = np.random.default_rng(0)
    histograms = rng.random((2000, BINS**3), dtype=np.float32)
    histograms /= histograms.sum(axis=1, keepdims=True)
    left, right = rng.integers(0, len(histograms), size=(2, PAIRS))
    started = time.perf_counter()
    ColourCheck(histograms, 0.85).agree(left, right)
    seconds = time.perf_counter() - started
    print(f"the check of {PAIRS:,} pairs: {seconds:.2f} s, {seconds / PAIRS * 1e6:.2f} us a pair")
    static_shot(args.static_frames, rng)


def static_shot(n: int, rng: np.random.Generator) -> None:
    """`deduplicate` over n frames of one video that are all alike, without and with the check."""
    embeddings = rng.normal(size=768).astype(np.float32) + 0.05 * rng.normal(size=(n, 768)).astype(
        np.float32
    )
    colour = rng.random(BINS**3, dtype=np.float32)
    histograms = np.abs(colour + 1e-5 * rng.normal(size=(n, BINS**3)).astype(np.float32))
    histograms /= histograms.sum(axis=1, keepdims=True)
    for check in (None, ColourCheck(histograms, 0.85)) * 2:
        started = time.perf_counter()
        result = deduplicate(
            embeddings,
            frame_ids=[f"static_{i:06d}" for i in range(n)],
            video_ids=["static"] * n,
            scores=np.ones(n),
            sharpness=np.ones(n),
            threshold=0.9,
            device="cpu",
            colours=check,
        )
        print(
            f"a static shot of {n:,} frames ({result.pairs_found:,} similar pairs), "
            f"{'with' if check else 'without'} the colour check: "
            f"{time.perf_counter() - started:.1f} s, {result.kept} kept"
        )


if __name__ == "__main__":
    main()
