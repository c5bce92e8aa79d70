"""Benchmark near-duplicate grouping (assets.dedup.grouping) and its search engines, in one run.

Synthetic data: unit random 768-d vectors plus planted duplicates: 1,000 groups of 10 vectors at
cosine ~0.96 to each other (half of them inside one video, half spread over ten videos) and one
group of 500 identical vectors spread over the videos; 100 frames per video; random filter scores
and sharpness. Random vectors are pairwise far below the threshold, so every random frame must be
kept and every planted group must end with exactly one frame.

Per size, in one process:
* `deduplicate` as the pipeline runs it (FAISS, exact per video, the IVF index across videos);
* one search for every pair of all vectors with each engine: NumPy exact tiles (the upper
  triangle, the search before FAISS), FAISS flat (exact: IndexFlatIP range searches, core's exact
  path), FAISS IVF (core's approximate path), and with --ivf-per-query FAISS's own
  IndexIVFFlat.range_search, one query at a time (timed on a sample of queries). Exact engines
  above --exact-max vectors run on the first --exact-max (every planted vector included) and
  their time is scaled by (n / m)^2;
* with --products, NumPy against a FAISS range search on the block shapes the search uses;
* with --hnsw, an HNSW index (build and a k-NN search; its range search aborts in faiss 1.15);
* the reference system's greedy kNN pass (exact faiss IndexFlatIP, k nearest neighbours, keep in
  list order, per video then across the survivors; O(N^2), up to --reference-limit vectors).

    python bench/dedup.py --sizes small large --products --ivf-per-query
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import resource
import sys
import time
from dataclasses import dataclass

import numpy as np

from dataminer_dagster.assets.dedup.grouping import SIMILARITY_TOLERANCE, deduplicate, similar_pairs
from dataminer_dagster.assets.dedup.pair_search import search_engine

SIZES = {"tiny": 10_000, "small": 100_000, "large": 1_100_000}  # random vectors; planted added
GROUPS = 1000
GROUP_SIZE = 10
IDENTICAL = 500
MEMBER_COSINE_TO_CENTRE = 0.98  # two members: ~0.98^2 = 0.96 to each other
TILE = 2048


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


# ------------------------------------------------------------------------------ the machine


def environment() -> list[str]:
    """BLAS and thread settings that decide these timings."""
    import faiss

    names = [
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
    ]
    lines = [
        "environment: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in names),
        f"faiss {faiss.__version__}: omp_get_max_threads() = {faiss.omp_get_max_threads()}, "
        f"compile options {faiss.get_compile_options().strip()}, search engine "
        f"{search_engine()}; numpy {np.__version__}; {os.cpu_count()} CPUs",
    ]
    lines += [f"BLAS loaded: {line}" for line in _openblas_libraries()]
    return lines


def _openblas_libraries() -> list[str]:
    """Every OpenBLAS in this process (numpy's and faiss's own): core type, build, threads."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    found = []
    for path in paths:
        library = ctypes.CDLL(path)
        for prefix, suffix in (("", ""), ("scipy_", "64_"), ("", "64_")):
            corename = getattr(library, f"{prefix}openblas_get_corename{suffix}", None)
            if corename is None:
                continue
            config = getattr(library, f"{prefix}openblas_get_config{suffix}")
            threads = getattr(library, f"{prefix}openblas_get_num_threads{suffix}")
            corename.restype = config.restype = ctypes.c_char_p
            found.append(
                f"{os.path.basename(path)}: core {corename().decode()}, {threads()} threads, "
                f"{config().decode().strip()}"
            )
            break
    return found


# --------------------------------------------------------------------------- whole grouping


def run_ours(
    data: Data, args, *, exact_limit: int | None = None, module=None, device: str | None = None
) -> Outcome:
    """`deduplicate` (or `module`'s) on the data; `device` as deduplicate takes it (default: its own)."""
    dedup = module.deduplicate if module is not None else deduplicate
    where = {} if device is None else {"device": device}
    wall, cpu = time.perf_counter(), time.process_time()
    result = dedup(
        data.x,
        frame_ids=data.frame_ids,
        video_ids=data.video_ids,
        scores=data.scores,
        sharpness=data.sharpness,
        threshold=args.threshold,
        exact_limit=exact_limit or args.exact_limit,
        nprobe=args.nprobe,
        recall_sample=args.recall_sample,
        **where,
    )
    search = "exact" if result.exact else f"IVF, nprobe {args.nprobe}"
    engine = getattr(result, "engine", "faiss-cpu")
    name = "ours" if module is None else f"--compare-with {os.path.basename(args.compare_with)}"
    return Outcome(
        method=f"{name} ({search}, {engine})",
        seconds=time.perf_counter() - wall,
        cpu_seconds=time.process_time() - cpu,
        kept=result.is_representative,
        recall=result.recall,
        recall_pairs=result.recall_pairs,
        note=f"{result.pairs_found} pairs; {result.within_video_kept} after phase 1",
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


# ---------------------------------------------------------------------- one search, engines


@dataclass
class Search:
    engine: str
    searched: int  # vectors the engine searched (a prefix of the data when scaled)
    seconds: float  # measured
    estimate: float  # for all n vectors: measured, or scaled from the prefix / sample
    i: np.ndarray | None  # pairs found; None when only timed on a sample of queries
    j: np.ndarray | None
    note: str = ""


def numpy_exact_tiles(x: np.ndarray, cut: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact search before FAISS: upper-triangle tiles of x @ x.T on NumPy's BLAS."""
    found_i, found_j = [], []
    n = len(x)
    for a0 in range(0, n, TILE):
        left = x[a0 : a0 + TILE]
        for b0 in range(a0, n, TILE):
            a, b = np.nonzero(left @ x[b0 : b0 + TILE].T >= cut)
            a += a0
            b += b0
            upper = a < b
            found_i.append(a[upper])
            found_j.append(b[upper])
    return np.concatenate(found_i), np.concatenate(found_j)


def search_engines(data: Data, args) -> list[Search]:
    n = len(data.x)
    cut = args.threshold - SIMILARITY_TOLERANCE
    m = min(n, args.exact_max)
    prefix = data.x[:m]  # rows [0, planted) are the planted vectors: all of them are in
    scale = (n / m) ** 2
    exact_note = "" if m == n else f"first {m:,} vectors, time x (n/m)^2 = x{scale:.1f}"
    runs = []

    started = time.perf_counter()
    i, j = numpy_exact_tiles(prefix, cut)
    seconds = time.perf_counter() - started
    runs.append(Search("NumPy exact tiles", m, seconds, seconds * scale, i, j, exact_note))

    started = time.perf_counter()
    i, j = similar_pairs(prefix, args.threshold, exact_limit=m, device="cpu")
    seconds = time.perf_counter() - started
    runs.append(Search("FAISS flat (core, exact)", m, seconds, seconds * scale, i, j, exact_note))

    started = time.perf_counter()
    i, j = similar_pairs(
        data.x, args.threshold, exact_limit=1, nprobe=args.nprobe, seed=args.seed, device="cpu"
    )
    seconds = time.perf_counter() - started
    runs.append(
        Search(f"FAISS IVF (core, nprobe {args.nprobe})", n, seconds, seconds, i, j, "all pairs")
    )
    if args.ivf_per_query:
        runs.append(ivf_per_query(data.x, cut, args))
    if args.hnsw:
        runs.append(hnsw_knn(data.x, cut, args))
    return runs


def ivf_per_query(x: np.ndarray, cut: float, args) -> Search:
    """FAISS's own IVF search: same lists and nprobe as core, range_search one query at a time."""
    import math

    import faiss

    n, d = x.shape
    lists = max(1, min(n, round(math.sqrt(args.nprobe * n))))
    started = time.perf_counter()
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.spherical = True
    index.cp.niter = 5
    index.cp.max_points_per_centroid = 16
    index.cp.min_points_per_centroid = 1
    index.train(x)
    index.add(x)
    index.nprobe = args.nprobe
    built = time.perf_counter() - started
    queries = np.random.default_rng(args.seed).choice(
        n, size=min(n, args.query_sample), replace=False
    )
    started = time.perf_counter()
    index.range_search(x[np.sort(queries)], cut)
    searched = time.perf_counter() - started
    del index
    return Search(
        f"FAISS IndexIVFFlat.range_search ({lists:,} lists, nprobe {args.nprobe})",
        n,
        built + searched,
        built + searched * n / len(queries),
        None,
        None,
        f"build {built:.1f} s; {len(queries):,} queries in {searched:.1f} s, scaled to n",
    )


def hnsw_knn(x: np.ndarray, cut: float, args) -> Search:
    """HNSW (M 32, efConstruction 40, efSearch 64): build and k-NN of every vector, k = --k."""
    import faiss

    index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = 40
    started = time.perf_counter()
    index.add(x)
    built = time.perf_counter() - started
    index.hnsw.efSearch = 64
    sims, neighbours = index.search(x, args.k)
    seconds = time.perf_counter() - started
    rows = np.repeat(np.arange(len(x)), args.k).reshape(len(x), args.k)
    hit = (sims >= cut) & (neighbours >= 0) & (neighbours != rows)
    # A pair may come from either vector's list, or both: each once, smaller index first.
    pairs = np.unique(
        np.stack([np.minimum(rows, neighbours)[hit], np.maximum(rows, neighbours)[hit]]), axis=1
    )
    del index
    return Search(
        f"FAISS HNSW, k-NN k={args.k}",
        len(x),
        seconds,
        seconds,
        pairs[0],
        pairs[1],
        f"build {built:.1f} s; pairs from k-NN lists (no range search: it aborts in faiss 1.15)",
    )


def engine_table(data: Data, runs: list[Search]) -> str:
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    n = len(data.x)
    lines = [
        "| vectors | engine | searched | wall s | est. s for all | planted pairs found "
        "| other pairs | planted groups whole | random vectors paired | note |",
        "|" + "---|" * 10,
    ]
    for run in runs:
        if run.i is None:
            cells = "(timed only) | | | "
        else:
            m = run.searched
            kind = data.kind[:m]
            sizes = np.bincount(kind[kind >= 0])
            planted = int((sizes * (sizes - 1) // 2).sum())
            same = (kind[run.i] >= 0) & (kind[run.i] == kind[run.j])
            graph = coo_array((np.ones(len(run.i)), (run.i, run.j)), shape=(m, m))
            label = connected_components(graph, directed=False)[1]
            component = np.bincount(label)
            whole = sum(
                len(np.unique(label[kind == g])) == 1
                and component[label[kind == g][0]] == (kind == g).sum()
                for g in range(len(sizes))
            )
            paired = int(np.count_nonzero((kind < 0) & (component[label] > 1)))
            cells = (
                f"{int(same.sum()):,} of {planted:,} | {len(run.i) - int(same.sum()):,} "
                f"| {whole} of {len(sizes)} | {paired} | "
            )
        lines.append(
            f"| {n:,} | {run.engine} | {run.searched:,} | {run.seconds:.1f} | {run.estimate:.1f} "
            f"| {cells}{run.note} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------ product kernels


PRODUCT_SHAPES = [  # (queries, base): where the search multiplies blocks of these shapes
    (100, 100, "a video's frames, phase 1"),
    (1280, 80, "an IVF list at 110,500"),
    (1000, 1000, ""),
    (4200, 264, "an IVF list at 1.1M"),
    (1000, 2048, "recall sample against a tile"),
    (8192, 2048, "exact search, a query block against a column tile"),
]


def products(args) -> str:
    """NumPy `q @ b.T >= cut` against FAISS IndexFlatIP range search, same data, alternated."""
    import faiss

    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((8192 + 2048, args.dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    cut = args.threshold - SIMILARITY_TOLERANCE

    def numpy_pairs(q, b):
        return np.nonzero(q @ b.T >= cut)

    def faiss_pairs(q, b):
        index = faiss.IndexFlatIP(b.shape[1])
        index.add(b)
        return index.range_search(q, cut)

    lines = [
        "| queries x base | used for | NumPy ms | FAISS range search ms |",
        "|---|---|---|---|",
    ]
    for nq, nb, use in PRODUCT_SHAPES:
        q, b = x[:nq], x[8192 : 8192 + nb]
        repeats = max(3, int(2e9 / (nq * nb * args.dim)))
        best = {}
        for _ in range(3):  # alternate, keep each one's best: the load changes between calls
            for name, kernel in (("numpy", numpy_pairs), ("faiss", faiss_pairs)):
                started = time.perf_counter()
                for _ in range(repeats):
                    kernel(q, b)
                ms = (time.perf_counter() - started) / repeats * 1000
                best[name] = min(best.get(name, ms), ms)
        lines.append(f"| {nq:,} x {nb:,} | {use} | {best['numpy']:.2f} | {best['faiss']:.2f} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------- main


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("compared_dedup", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small"], choices=sorted(SIZES))
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--frames-per-video", type=int, default=100)
    parser.add_argument("--exact-limit", type=int, default=20_000)
    parser.add_argument("--nprobe", type=int, default=16)
    parser.add_argument("--recall-sample", type=int, default=1000)
    parser.add_argument("--k", type=int, default=50, help="neighbours of the reference and HNSW")
    parser.add_argument(
        "--reference-limit",
        type=int,
        default=0,
        help="run the reference greedy kNN pass up to this many vectors (O(N^2): ~2 h at 1.1M)",
    )
    parser.add_argument(
        "--also-exact",
        action="store_true",
        help="also run deduplicate with exact search only, up to --exact-max vectors",
    )
    parser.add_argument(
        "--exact-max",
        type=int,
        default=150_000,
        help="exact engines search at most this many vectors (a prefix), time scaled by (n/m)^2",
    )
    parser.add_argument("--no-engines", action="store_true", help="skip the one-search engines")
    parser.add_argument("--ivf-per-query", action="store_true", help="time IndexIVFFlat too")
    parser.add_argument("--query-sample", type=int, default=5000)
    parser.add_argument("--hnsw", action="store_true", help="build and search an HNSW index too")
    parser.add_argument("--products", action="store_true", help="NumPy vs FAISS per block shape")
    parser.add_argument(
        "--compare-with",
        metavar="FILE",
        help="also run deduplicate from this module file (e.g. an earlier assets/dedup/grouping.py)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print("\n".join(environment()))
    print(f"load average (1, 5, 15 min) at start: {os.getloadavg()}\n")
    if args.products:
        print(products(args), "\n", flush=True)
    compared = load_module(args.compare_with) if args.compare_with else None
    for size in args.sizes:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        data = make_data(SIZES[size], args.dim, args.frames_per_video, args.seed)
        n = len(data.x)
        print(
            f"{size}: {n:,} vectors of {args.dim}-d made in {time.perf_counter() - started:.1f} s"
        )
        ours = run_ours(data, args)
        rows = [summarise(data, ours)]
        if compared is not None:
            other = run_ours(data, args, module=compared)
            other.note += (
                f"; keeps the same frames as ours: {bool((other.kept == ours.kept).all())}"
            )
            rows.append(summarise(data, other))
        if args.also_exact and n <= args.exact_max:
            exact = run_ours(data, args, exact_limit=n)
            exact.note += (
                f"; keeps the same frames as ours: {bool((exact.kept == ours.kept).all())}"
            )
            rows.append(summarise(data, exact))
        if n <= args.reference_limit:
            rows.append(summarise(data, run_reference(data, args)))
        print(markdown(n, rows), "\n", flush=True)
        if not args.no_engines:
            print(engine_table(data, search_engines(data, args)), "\n", flush=True)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"load average (1 min) before {load_before:.1f}, after {os.getloadavg()[0]:.1f}")
        print(f"peak RSS of this process so far: {peak:.1f} GiB\n", flush=True)


if __name__ == "__main__":
    main()
