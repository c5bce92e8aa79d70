"""Filter throughput: SiglipScorer over JPEG files on disk vs the bare model forward pass.

Both sides run in one process on the same device, batch size and random-weight model, so the
ratio is meaningful even on a busy machine; absolute numbers are not. Pipeline = read + decode +
preprocess on the prefetch threads + forward + normalise + copy back, for `--frames` synthetic
1280x720 JPEGs. Bare = `get_image_features` on one pre-made pixel batch, for as many images.
The frames are split into `--rounds` segments and the two sides alternate segment by segment,
so a change in machine load hits both alike. Goal: pipeline >= 0.85 x bare.

    /work/venv/bin/python bench/filter.py                             # ViT-B/16 224, 256 frames
    /work/venv/bin/python bench/filter.py --frames 64 --vision tiny   # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import cv2

from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames
from dataminer_dagster.models.siglip import SiglipScorer
from dataminer_dagster.models.tiny import SIGLIP_VISION_PRESETS, build_tiny_siglip


def write_frames(folder: Path, count: int, quality: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    spec = SyntheticVideoSpec(
        width=1280, height=720, fps=10.0, seconds=count / 10.0, scene_cuts=(count / 30.0,)
    )
    paths = []
    for index, frame in enumerate(synthetic_frames(spec)):
        if index == count:
            break
        path = folder / f"bench_{index:06d}.jpg"
        if not path.exists():
            cv2.imwrite(str(path), frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
        paths.append(path)
    return paths


def time_bare(scorer: SiglipScorer, images: int, batch_size: int) -> float:
    """Seconds for `images` images through get_image_features on a resident batch."""
    import torch

    size = scorer.image_processor.size
    pixels = torch.rand(batch_size, 3, size["height"], size["width"]) * 2 - 1
    pixels = pixels.to(scorer.device, dtype=scorer.loaded.dtype)
    sizes = [min(batch_size, images - start) for start in range(0, images, batch_size)]
    with torch.inference_mode():
        _synchronise(scorer.device)
        started = time.perf_counter()
        for n in sizes:
            scorer.model.get_image_features(pixel_values=pixels[:n])
        _synchronise(scorer.device)
    return time.perf_counter() - started


def time_pipeline(scorer: SiglipScorer, paths: list[Path]) -> tuple[float, float]:
    """Seconds for all `paths` through embed_images, and the part spent waiting for batches."""
    started = time.perf_counter()
    waited = 0.0
    embedded = 0
    for batch in scorer.embed_images(paths):
        waited += batch.wait_s
        embedded += len(batch.indices)
    _synchronise(scorer.device)
    assert embedded == len(paths), f"only {embedded} of {len(paths)} frames were embedded"
    return time.perf_counter() - started, waited


def _synchronise(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2, help="prefetch threads")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--vision", default="base-patch16-224", choices=SIGLIP_VISION_PRESETS)
    parser.add_argument("--rounds", type=int, default=4, help="alternating segments")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality of the frames")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--workdir", type=Path, help="keep model and frames here between runs")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-filter-"))
    model_dir = workdir / f"siglip-random-{args.vision}"
    if not (model_dir / "config.json").exists():
        build_tiny_siglip(model_dir, vision_preset=args.vision)
    paths = write_frames(workdir / "frames", args.frames, args.quality)
    scorer = SiglipScorer(
        model_dir, device=args.device, batch_size=args.batch_size, prefetch_workers=args.workers
    )
    mean_kb = sum(p.stat().st_size for p in paths) / len(paths) / 1024

    # Warm-up: first-call allocations and kernel selection, on both paths.
    time_bare(scorer, args.batch_size, args.batch_size)
    list(scorer.embed_images(paths[: args.batch_size]))

    rows = []
    per_round = -(-len(paths) // args.rounds)
    for start in range(0, len(paths), per_round):
        segment = paths[start : start + per_round]
        bare_s = time_bare(scorer, len(segment), args.batch_size)
        pipe_s, wait_s = time_pipeline(scorer, segment)
        rows.append((len(segment), bare_s, pipe_s, wait_s))

    print(
        f"device {scorer.device}, dtype {scorer.loaded.dtype}, vision {args.vision}, "
        f"batch {args.batch_size}, prefetch workers {args.workers}, torch threads "
        f"{torch.get_num_threads()}, cpus {os.cpu_count()}, load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        f"{len(paths)} frames of 1280x720 JPEG (quality {args.quality}, mean {mean_kb:.0f} KiB)\n"
    )
    print("| round | frames | bare img/s | pipeline img/s | pipeline / bare | model waited (s) |")
    print("|---|---|---|---|---|---|")
    for number, (frames, bare_s, pipe_s, wait_s) in enumerate(rows, start=1):
        print(
            f"| {number} | {frames} | {frames / bare_s:.2f} | {frames / pipe_s:.2f} | "
            f"{bare_s / pipe_s:.3f} | {wait_s:.2f} |"
        )
    bare_total, pipe_total = sum(r[1] for r in rows), sum(r[2] for r in rows)
    wait_total = sum(r[3] for r in rows)
    print(
        f"| all | {len(paths)} | {len(paths) / bare_total:.2f} | {len(paths) / pipe_total:.2f} | "
        f"{bare_total / pipe_total:.3f} | {wait_total:.2f} |"
    )
    median = statistics.median(r[1] / r[2] for r in rows)
    print(
        f"\npipeline / bare: {bare_total / pipe_total:.3f} overall, {median:.3f} median of rounds "
        f"(goal >= 0.85); the model waited for input {100 * wait_total / pipe_total:.1f}% "
        "of the pipeline time"
    )


if __name__ == "__main__":
    main()
