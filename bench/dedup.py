"""Benchmark near-duplicate grouping (core.dedup) against the reference system's greedy kNN pass.

Synthetic data: unit random 768-d vectors plus planted duplicates: 1,000 groups of 10 vectors at
cosine ~0.96 to each other (half of them inside one video, half spread over ten videos) and one
group of 500 identical vectors spread over the videos; 100 frames per video; random filter scores
and sharpness. Random vectors are pairwise far below the threshold, so every random frame must be
kept and every planted group must end with exactly one frame.

The reference (the original system, reimplemented here only) runs exact faiss IndexFlatIP, takes
the k nearest neighbours and greedily keeps frames in list order, first per video and then across
the survivors. Its second phase is O(N^2); by default it runs only up to --reference-limit vectors.

    /work/venv/bin/python bench/dedup.py --sizes small large
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import dataclass

import numpy as np

from dataminer_dagster.core.dedup import deduplicate, similar_pairs

SIZES = {"tiny": 10_000, "small": 100_000, "large": 1_100_000}  # random vectors; planted added
GROUPS = 1000
GROUP_SIZE = 10
IDENTICAL = 500
MEMBER_COSINE_TO_CENTRE = 0.98  # two members: ~0.98^2 = 0.96 to each other


@dataclass
class Data:
    x: np.ndarray  # (n, d) float32, unit rows
    frame_ids: list[str]
    video_ids: list[str]
    kind: np.ndarray  # int: -1 random, 0..GROUPS-1 near-duplicate group, GROUPS identical group
    scores: np.ndarray
    sharpness: np.ndarray


@dataclass
class Outcome:
    method: str
    seconds: float
    cpu_seconds: float
    kept: np.ndarray  # bool per frame
    recall: float | None = None
    recall_pairs: int = 0
    note: str = ""


def make_data(random_count: int, dim: int, frames_per_video: int, seed: int) -> Data:
    rng = np.random.default_rng(seed)
    planted = GROUPS * GROUP_SIZE + IDENTICAL
    n = random_count + planted
    x = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 65536):
        block = rng.standard_normal((min(65536, n - start), dim), dtype=np.float32)
        x[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    kind = np.full(n, -1, dtype=np.int64)
    # Rows [0, planted) hold the planted vectors, overwritten below; the rest stay random.
    centres = x[:GROUPS].copy()
    for g in range(GROUPS):
        rows = slice(g * GROUP_SIZE, (g + 1) * GROUP_SIZE)
        noise = rng.standard_normal((GROUP_SIZE, dim), dtype=np.float32)
        noise -= np.outer(noise @ centres[g], centres[g])
        noise /= np.linalg.norm(noise, axis=1, keepdims=True)
        side = np.sqrt(1 - MEMBER_COSINE_TO_CENTRE**2)
        members = MEMBER_COSINE_TO_CENTRE * centres[g] + side * noise
        x[rows] = members / np.linalg.norm(members, axis=1, keepdims=True)
        kind[rows] = g
        sims = x[rows] @ x[rows].T
        assert sims[np.triu_indices(GROUP_SIZE, 1)].min() > 0.95, "planted group not > 0.95"
    identical = slice(GROUPS * GROUP_SIZE, planted)
    copy = rng.standard_normal(dim, dtype=np.float32)
    x[identical] = copy / np.linalg.norm(copy)
    kind[identical] = GROUPS

    # Videos of `frames_per_video` frames. Groups 0..GROUPS/2-1 each sit inside one video; the other
    # groups, the identical copies and the random vectors are spread at random.
    videos = -(-n // frames_per_video)
    capacity = np.bincount(np.arange(n) // frames_per_video, minlength=videos)
    in_video = GROUPS // 2 * GROUP_SIZE
    video_of = np.empty(n, dtype=np.int64)
    video_of[:in_video] = (np.arange(in_video) // GROUP_SIZE) % videos
    capacity -= np.bincount(video_of[:in_video], minlength=videos)
    assert capacity.min() >= 0, "too few frames per video for the in-video groups"
    video_of[in_video:] = rng.permutation(np.repeat(np.arange(videos), capacity))
    # Frame numbers within a video in random order, so list order says nothing about the groups.
    order = np.lexsort((rng.permutation(n), video_of))
    frame_number = np.empty(n, dtype=np.int64)
    first_of_video = np.searchsorted(video_of[order], np.arange(videos))
    frame_number[order] = np.arange(n) - first_of_video[video_of[order]]
    return Data(
        x=x,
        frame_ids=[f"vid{v:06d}_{f:06d}" for v, f in zip(video_of, frame_number, strict=True)],
        video_ids=[f"vid{v:06d}" for v in video_of],
        kind=kind,
        scores=rng.random(n),
        sharpness=rng.random(n),
    )


def run_ours(data: Data, args) -> Outcome:
    wall, cpu = time.perf_counter(), time.process_time()
    result = deduplicate(
        data.x,
        frame_ids=data.frame_ids,
        video_ids=data.video_ids,
        scores=data.scores,
        sharpness=data.sharpness,
        threshold=args.threshold,
        exact_limit=args.exact_limit,
        nprobe=args.nprobe,
        recall_sample=args.recall_sample,
    )
    return Outcome(
        method="ours (exact)" if result.exact else f"ours (IVF, nprobe {args.nprobe})",
        seconds=time.perf_counter() - wall,
        cpu_seconds=time.process_time() - cpu,
        kept=result.is_representative,
        recall=result.recall,
        recall_pairs=result.recall_pairs,
        note=f"{result.pairs_found} pairs; {result.within_video_kept} after phase 1",
    )


def planted_recall(data: Data, args) -> str:
    """Recall of one search over all vectors, against the planted pairs (the only true ones)."""
    wall = time.perf_counter()
    i, j = similar_pairs(
        data.x, args.threshold, exact_limit=args.exact_limit, nprobe=args.nprobe, seed=args.seed
    )
    same = (data.kind[i] >= 0) & (data.kind[i] == data.kind[j])
    sizes = np.bincount(data.kind[data.kind >= 0])
    planted = int((sizes * (sizes - 1) // 2).sum())
    near = same & (data.kind[i] < GROUPS)
    near_total = GROUPS * GROUP_SIZE * (GROUP_SIZE - 1) // 2
    return (
        f"one search over all {len(data.x):,} vectors found {int(same.sum()):,} of {planted:,} "
        f"planted pairs (recall {same.sum() / planted:.5f}; near-duplicate pairs "
        f"{int(near.sum()):,} of {near_total:,}), {len(i) - int(same.sum())} other pairs, "
        f"in {time.perf_counter() - wall:.1f} s"
    )


def greedy_knn(x: np.ndarray, threshold: float, k: int) -> np.ndarray:
    """The reference pass: keep i unless removed, remove its kNN j != i with sim >= threshold."""
    import faiss

    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    sims, neighbours = index.search(x, min(k, len(x)))
    removed = np.zeros(len(x), dtype=bool)
    kept = []
    for i in range(len(x)):
        if removed[i]:
            continue
        kept.append(i)
        hit = (sims[i] >= threshold) & (neighbours[i] != i)
        removed[neighbours[i][hit]] = True
    return np.asarray(kept, dtype=np.int64)


def run_reference(data: Data, args) -> Outcome:
    wall, cpu = time.perf_counter(), time.process_time()
    # List order as the original saw it: videos in order, frames by file name within a video.
    order = np.lexsort((np.asarray(data.frame_ids), np.asarray(data.video_ids)))
    videos = np.asarray(data.video_ids)[order]
    starts = np.flatnonzero(np.r_[True, videos[1:] != videos[:-1]])
    survivors = []
    for start, stop in zip(starts, np.r_[starts[1:], len(order)], strict=True):
        rows = order[start:stop]
        survivors.append(
            rows if len(rows) == 1 else rows[greedy_knn(data.x[rows], args.threshold, args.k)]
        )
    survivors = np.concatenate(survivors)
    final = survivors[greedy_knn(np.ascontiguousarray(data.x[survivors]), args.threshold, args.k)]
    kept = np.zeros(len(data.x), dtype=bool)
    kept[final] = True
    return Outcome(
        method=f"reference (greedy kNN, k={args.k})",
        seconds=time.perf_counter() - wall,
        cpu_seconds=time.process_time() - cpu,
        kept=kept,
        note=f"{len(survivors)} after phase 1",
    )


def summarise(data: Data, outcome: Outcome) -> dict:
    kept_per_group = np.bincount(data.kind[data.kind >= 0], weights=outcome.kept[data.kind >= 0])
    near = kept_per_group[:GROUPS].astype(int)
    return {
        "method": outcome.method,
        "seconds": outcome.seconds,
        "cpu": outcome.cpu_seconds,
        "kept": int(outcome.kept.sum()),
        "in-video groups at 1": int(np.count_nonzero(near[: GROUPS // 2] == 1)),
        "spread groups at 1": int(np.count_nonzero(near[GROUPS // 2 :] == 1)),
        "near-dup frames kept": int(near.sum()),
        "max kept of a group": int(near.max()),
        "identical kept": int(kept_per_group[GROUPS]),
        "random removed": int(np.count_nonzero(~outcome.kept[data.kind < 0])),
        "recall": outcome.recall,
        "recall_pairs": outcome.recall_pairs,
        "note": outcome.note,
    }


def markdown(n: int, rows: list[dict]) -> str:
    header = (
        "| vectors | method | wall s | CPU s | kept | in-video groups at 1 (of 500) "
        "| spread groups at 1 (of 500) | near-dup frames kept (ideal 1000) "
        "| identical kept (of 500) | random removed | recall (pairs) | note |"
    )
    lines = [header, "|" + "---|" * 12]
    for r in rows:
        recall = "exact" if r["recall"] is None else f"{r['recall']:.4f} ({r['recall_pairs']})"
        lines.append(
            f"| {n:,} | {r['method']} | {r['seconds']:.1f} | {r['cpu']:.1f} | {r['kept']:,} "
            f"| {r['in-video groups at 1']} | {r['spread groups at 1']} "
            f"| {r['near-dup frames kept']} | {r['identical kept']} | {r['random removed']} "
            f"| {recall} | {r['note']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small"], choices=sorted(SIZES))
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--frames-per-video", type=int, default=100)
    parser.add_argument("--exact-limit", type=int, default=20_000)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--recall-sample", type=int, default=1000)
    parser.add_argument("--k", type=int, default=50, help="neighbours of the reference pass")
    parser.add_argument(
        "--reference-limit",
        type=int,
        default=200_000,
        help="run the reference only up to this many vectors (O(N^2): ~2 h at 1.1M)",
    )
    parser.add_argument("--force-reference", action="store_true", help="run it at every size")
    parser.add_argument(
        "--also-exact",
        action="store_true",
        help="also run ours with exact search only (O(N^2) too: up to --reference-limit)",
    )
    parser.add_argument(
        "--planted-recall",
        action="store_true",
        help="also search all vectors once (similar_pairs) and count the planted pairs found",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    for size in args.sizes:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        data = make_data(SIZES[size], args.dim, args.frames_per_video, args.seed)
        n = len(data.x)
        print(
            f"{size}: {n:,} vectors of {args.dim}-d made in {time.perf_counter() - started:.1f} s"
        )
        print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '(unset)')}")
        ours = run_ours(data, args)
        rows = [summarise(data, ours)]
        if args.also_exact and n <= args.reference_limit:
            exact = run_ours(data, argparse.Namespace(**{**vars(args), "exact_limit": n}))
            same = bool((exact.kept == ours.kept).all())
            exact.note += f"; keeps the same frames as the default run: {same}"
            rows.append(summarise(data, exact))
        if args.force_reference or n <= args.reference_limit:
            rows.append(summarise(data, run_reference(data, args)))
        else:
            print(f"reference skipped at {n:,} vectors (> --reference-limit; --force-reference)")
        print(markdown(n, rows))
        if args.planted_recall:
            print(planted_recall(data, args))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")
        print(f"peak RSS of this process so far: {peak:.1f} GiB\n")


if __name__ == "__main__":
    main()
