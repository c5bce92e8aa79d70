"""Benchmark incremental dedup (issue 27, item 2): new frames placed against a project's kept
frames (assets/dedup/kept_index.py) against grouping every frame again (assets/dedup/grouping.deduplicate), in one
run on the same data.

Data: `--kept` unit random 768-d vectors (100 frames per video), all far apart at threshold 0.9,
so a full dedup keeps every one; then `--new` new frames of new videos: a quarter near-copies
(cosine ~0.96) of random kept frames, a quarter in pairs of near-copies of each other, the rest
random. The right answer is known: the near-copies of kept frames join those frames' groups, each
new pair keeps one frame, every random new frame is kept.

Timed, in one process:
* full: `deduplicate` over every frame (kept + new), as `dedup.incremental: false` or a changed
  setting does;
* build: the kept index written from the kept frames (once, after a full dedup; not per new batch);
* incremental: the index opened from disk, the new frames placed (`place_new_frames`), and the
  new kept frames added as a segment; and, as the stage does it, the dedup table (one row per
  frame) read, extended and written back;

    python bench/incremental_dedup.py --kept 1000000 --new 1000
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dedup import environment  # noqa: E402 - the same BLAS and thread report

from dataminer_dagster.assets.dedup.grouping import deduplicate  # noqa: E402
from dataminer_dagster.assets.dedup.kept_index import IndexWriter, KeptIndex, place_new_frames  # noqa: E402
from dataminer_dagster.core.files import publish, staging_path  # noqa: E402

DIM = 768
THRESHOLD = 0.9
PER_VIDEO = 100


def unit(rng, n: int) -> np.ndarray:
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def near(rng, x: np.ndarray) -> np.ndarray:
    y = x + 0.3 * rng.standard_normal(x.shape, dtype=np.float32) / np.sqrt(DIM)
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def frame_ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i // PER_VIDEO:07d}_{i % PER_VIDEO:06d}" for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kept", type=int, default=1_000_000)
    parser.add_argument("--new", type=int, default=1_000)
    parser.add_argument("--exact-limit", type=int, default=20_000)
    parser.add_argument("--skip-full", action="store_true", help="Do not time the full dedup.")
    parser.add_argument("--repeats", type=int, default=3, help="Incremental steps timed.")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    for line in environment():
        print(line)
    print(f"load average at start: {os.getloadavg()}")

    rng = np.random.default_rng(0)
    started = time.perf_counter()
    kept = unit(rng, args.kept)
    kept_ids = frame_ids("old", args.kept)
    quarter = args.new // 4
    targets = rng.choice(args.kept, size=quarter, replace=False)
    pairs = unit(rng, quarter // 2)
    new = np.concatenate(
        [
            near(rng, kept[targets]),
            near(rng, pairs),
            near(rng, pairs),
            unit(rng, args.new - quarter - 2 * (quarter // 2)),
        ]
    )
    new_ids = frame_ids("new", len(new))
    new_videos = [f.split("_")[0] for f in new_ids]
    print(f"data: {args.kept:,} kept + {len(new):,} new in {time.perf_counter() - started:.1f} s")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="incremental-dedup-"))
    folder = work / "kept_index"
    try:
        started = time.perf_counter()
        staged = IndexWriter(folder, staging_path(folder)).rebuild(
            kept, kept_ids, "bench", exact_limit=args.exact_limit
        )
        publish(staged, folder)
        build_s = time.perf_counter() - started
        size_gb = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
        print(f"build: {build_s:.1f} s, {size_gb:.2f} GB on disk")

        table = pd.DataFrame(
            {
                "frame_id": kept_ids,
                "video_id": [f.split("_")[0] for f in kept_ids],
                "pos_max": rng.random(args.kept),
                "group": np.arange(args.kept),
                "group_size": np.ones(args.kept, np.int64),
                "kept": np.ones(args.kept, bool),
            }
        )
        table_path = work / "frames.parquet"
        table.to_parquet(table_path, index=False)
        del table

        steps = []
        for repeat in range(args.repeats):
            steps.append(incremental_step(folder, table_path, new, new_ids, new_videos, args))
            print(
                f"incremental step {repeat + 1}: "
                + ", ".join(f"{k} {v}" for k, v in steps[-1].items())
            )
        best = min(steps, key=lambda s: s["total_s"])

        if not args.skip_full:
            everything = np.concatenate([kept, new])
            ids = kept_ids + new_ids
            started = time.perf_counter()
            result = deduplicate(
                everything,
                frame_ids=ids,
                video_ids=[f.split("_")[0] for f in ids],
                scores=np.ones(len(ids)),
                sharpness=np.ones(len(ids)),
                threshold=THRESHOLD,
                exact_limit=args.exact_limit,
            )
            full_s = time.perf_counter() - started
            print(
                f"full dedup of {len(ids):,} frames: {full_s:.1f} s, kept {result.kept:,} "
                f"(recall {result.recall})"
            )
            print(f"incremental (best of {args.repeats}) / full: {best['total_s'] / full_s:.4f}")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak RSS {peak:.1f} GB; load average at end: {os.getloadavg()}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


def incremental_step(folder, table_path, new, new_ids, new_videos, args) -> dict:
    """What deduped_set does with new frames, timed; the index and table are left as they were."""
    quarter = args.new // 4
    timings = {}
    started = time.perf_counter()
    index = KeptIndex.open(folder, "bench")
    placed = place_new_frames(
        index,
        new,
        frame_ids=new_ids,
        video_ids=new_videos,
        scores=np.ones(len(new_ids)),
        sharpness=np.ones(len(new_ids)),
        threshold=THRESHOLD,
        exact_limit=args.exact_limit,
    )
    timings["place_s"] = round(time.perf_counter() - started, 2)
    joined = placed.joins != ""
    right = int(joined[:quarter].sum())
    kept_pairs = int(placed.is_representative[quarter : quarter + 2 * (quarter // 2)].sum())
    random_kept = int(placed.is_representative[quarter + 2 * (quarter // 2) :].sum())
    mark = time.perf_counter()
    staging = staging_path(folder)
    IndexWriter(folder, staging).add(
        index,
        new[placed.is_representative],
        np.asarray(new_ids)[placed.is_representative],
        exact_limit=args.exact_limit,
    )
    shutil.rmtree(staging)  # not published: every repeat starts from the same index
    timings["add_s"] = round(time.perf_counter() - mark, 2)
    mark = time.perf_counter()
    table = pd.read_parquet(table_path)
    grown = pd.concat(
        [table, pd.DataFrame({"frame_id": new_ids, "video_id": new_videos})], ignore_index=True
    )
    grown.to_parquet(table_path.with_suffix(".next"), index=False)
    timings["table_s"] = round(time.perf_counter() - mark, 2)
    timings["total_s"] = round(time.perf_counter() - started, 2)
    timings["joined_kept"] = f"{right}/{quarter}"
    timings["wrongly_joined"] = int(joined[quarter:].sum())
    timings["pairs_kept_once"] = f"{kept_pairs}/{quarter // 2}"
    timings["random_kept"] = f"{random_kept}/{args.new - quarter - 2 * (quarter // 2)}"
    timings["search"] = "exact" if placed.exact else "lists"
    return timings


if __name__ == "__main__":
    main()
