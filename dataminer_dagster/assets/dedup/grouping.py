"""Near-duplicate grouping of a project's frames by embedding similarity.

Two frames are duplicates when the cosine similarity of their embeddings is at least the
threshold and, with dedup.colour_overlap, their colours agree (`colour_check.py`). Every such pair
is an edge, and the groups are the connected components of that graph, so grouping is transitive
and does not depend on the order of the input: N identical frames keep exactly one, where a greedy
pass over k nearest neighbours keeps several (any beyond its k). A pair is looked at only while its
frames are apart: once other pairs have joined them, it could not change a group, so a static
shot's millions of similar pairs are compared by label, not folded into the graph or each checked
for colour.

Grouping runs in two phases, as the pipeline needs it: within each video first, then across videos
over the frames phase 1 kept. A frame's final group is the phase-2 group of its phase-1
representative. Each group keeps its best frame: highest filter score, then highest sharpness, then
the smallest frame id. Because every phase-1 representative is the best of its own group, the best
of a final group is always one of the frames phase 2 compared, so with exact search no two kept
frames are duplicates of each other.

FAISS carries the neighbour search. Up to `exact_limit` vectors it is exact: the upper triangle
in column tiles, each searched by a FAISS flat inner-product range search, never an N x N matrix.
Beyond, it is an inverted-file (IVF) index: lists from FAISS k-means, each vector assigned to its
`nprobe` nearest lists by a FAISS k-NN search of the centroids. Because the queries are the
indexed vectors themselves, the index is searched list by list (a list's members against every
vector that probes it, one block of products, as faiss.contrib.big_batch_search does for k-NN)
rather than query by query, which took several times as long (FAISS's own
IndexIVFFlat.range_search on as many lists). It only misses pairs, it never invents one (every
reported pair is an exact product above the threshold); `measure_recall` says how many it missed
on a sample. HNSW was measured and not chosen: its build alone cost more than this whole search,
its k-NN search left planted groups split, and faiss-cpu 1.15's HNSW range search aborts the
process. The figures: bench/dedup.md.

The products themselves are computed by a search engine (`assets/dedup/pair_search.py`): FAISS and NumPy
on the CPU, and on a GPU when there is one, FAISS's GPU kernels (faiss-gpu) or torch. Every engine
searches the same lists (k-means is trained on the CPU either way) with float32 products, so
results differ from the CPU only where a product's rounding crosses the threshold.

All work happens in frame-id order, so permuting the input changes nothing, not even in the
approximate search (its k-means sample and seed follow frame ids too).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dataminer_dagster.assets.dedup.colour_check import ColourCheck
from dataminer_dagster.assets.dedup.pair_search import TILE, bind, load_faiss

# Similarities are float32 dot products whose rounding depends on the kernel and the tiling; a
# pair within this distance below the threshold still counts, so that identical frames meet a
# threshold of 1.0 and a pair exactly at the threshold is a duplicate on every path.
SIMILARITY_TOLERANCE = 1e-6

# k-means only needs lists of similar size whose members are near each other; a small sample and
# few iterations do that, and training cost stays below the search's own.
_TRAIN_POINTS_PER_LIST = 16
_KMEANS_ITERATIONS = 5
_NORM_CHUNK = 8192  # rows per block when computing norms in float64
_NORM_TOLERANCE = 1e-4  # rows whose norm is this close to 1 count as normalised


@dataclass(frozen=True)
class Recall:
    """Recall of an approximate search, estimated against exact search on sampled queries."""

    recall: float | None  # found / true pairs; None when the sampled queries have no true pair
    true_pairs: int  # pairs (query, other) at or above the threshold by exact search
    found_pairs: int  # of those, how many the approximate search reported
    queries: int


@dataclass(frozen=True)
class DedupResult:
    """Grouping of the input frames; arrays are per input frame, in input order."""

    group: np.ndarray  # int64 group id 0..G-1, numbered in the order of the kept frames' ids
    is_representative: np.ndarray  # bool: the one kept frame of its group
    group_size: np.ndarray  # int64: number of frames in the frame's group
    within_video_kept: int  # frames left after phase 1 (the input of phase 2)
    pairs_found: int  # similar pairs found (the colour check may part some), phases 1 and 2
    exact: bool  # every search was exact
    recall: float | None  # pooled recall of the approximate searches; None when all were exact
    recall_pairs: int  # true pairs the recall estimate is based on
    seconds: float
    engine: str  # the search engine: "faiss-cpu", "faiss-gpu" or "torch-cuda" (pair_search.py)

    @property
    def kept(self) -> int:
        return int(np.count_nonzero(self.is_representative))

    @property
    def device(self) -> str:
        """Where the searches ran: "cpu" or "gpu"."""
        return "cpu" if self.engine == "faiss-cpu" else "gpu"


def deduplicate(
    embeddings: np.ndarray,
    *,
    frame_ids: Sequence[str],
    video_ids: Sequence[str],
    scores: np.ndarray,
    sharpness: np.ndarray,
    threshold: float,
    exact_limit: int = 20_000,
    nprobe: int = 16,
    recall_sample: int = 1000,
    seed: int = 0,
    device: str = "auto",
    colours: ColourCheck | None = None,
) -> DedupResult:
    """Group near-duplicate frames within each video, then across videos, and pick each group's best.

    `recall_sample` queries per approximate search are checked against exact search (0: skip).
    `device`: "auto" (a GPU when there is one), "cpu" or "gpu", or a model's device setting
    (cpu, cuda, cuda:N, mps; see `pair_search.search_request`). `colours`: the frames'
    colour histograms (in input order), when two duplicates' colours must agree too.
    """
    started = time.perf_counter()
    ids, by_id = _frame_order(frame_ids)
    n = len(ids)
    x = normalized(embeddings, frame_ids=ids)
    videos = _per_frame_array("video_ids", video_ids, n)
    id_rank = np.empty(n, dtype=np.int64)
    id_rank[by_id] = np.arange(n)
    quality = _quality_rank(ids, id_rank, scores, sharpness)
    _check_search_parameters(threshold, exact_limit, nprobe)
    products = bind(device, x)
    search = _Search(threshold, exact_limit, nprobe, recall_sample, seed, products, colours)

    within = _within_video_representative(x, by_id, videos, quality, search)
    survivors = by_id[within[by_id] == by_id]  # phase-1 representatives, in frame-id order
    survivor_label = np.empty(n, dtype=np.int64)
    survivor_label[survivors] = search.components(search.similar(x, survivors), survivors)
    label = survivor_label[within]

    best = _best_per_label(label, quality)  # best[g] = kept frame of label g
    renumber = np.empty(len(best), dtype=np.int64)
    renumber[np.argsort(id_rank[best])] = np.arange(len(best))
    group = renumber[label]
    is_representative = np.zeros(n, dtype=bool)
    is_representative[best] = True
    return DedupResult(
        group=group,
        is_representative=is_representative,
        group_size=np.bincount(group, minlength=len(best))[group].astype(np.int64),
        within_video_kept=len(survivors),
        pairs_found=search.pairs_found,
        exact=search.all_exact,
        recall=search.recall,
        recall_pairs=search.true_pairs,
        seconds=time.perf_counter() - started,
        engine=products.engine,
    )


def similar_pairs(
    embeddings: np.ndarray,
    threshold: float,
    *,
    exact_limit: int = 20_000,
    nprobe: int = 16,
    seed: int = 0,
    device: str = "auto",
    colours: ColourCheck | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """All pairs i < j with cosine similarity >= threshold (and, given `colours`, colours that
    agree), sorted; e.g. to check kept frames.

    Exact up to `exact_limit` vectors; beyond it approximate (may miss pairs, never adds one).
    """
    x = normalized(embeddings)
    _check_search_parameters(threshold, exact_limit, nprobe)
    search = _Search(threshold, exact_limit, nprobe, 0, seed, bind(device, x), colours)
    chunks = list(search.pairs(x, np.arange(len(x))))
    i = np.concatenate([c[0] for c in chunks]) if chunks else np.empty(0, dtype=np.int64)
    j = np.concatenate([c[1] for c in chunks]) if chunks else np.empty(0, dtype=np.int64)
    order = np.lexsort((j, i))
    return i[order], j[order]


def measure_recall(
    embeddings: np.ndarray,
    threshold: float,
    found: tuple[np.ndarray, np.ndarray],
    *,
    sample: int = 1000,
    seed: int = 0,
    device: str = "auto",
) -> Recall:
    """Fraction of the true pairs of `sample` random query vectors that `found` (i, j) contains."""
    x = normalized(embeddings)
    _check_threshold(threshold)
    queries = _recall_queries(len(x), sample, seed)
    cut = threshold - SIMILARITY_TOLERANCE
    products = bind(device, x)
    return _recall(np.arange(len(x)), cut, queries, found[0], found[1], products)


def normalized(embeddings: np.ndarray, *, frame_ids: Sequence[str] | None = None) -> np.ndarray:
    """Float32 rows of unit length; the input itself when it already is one (it is never written).

    Zero or non-finite rows are an error: a placeholder embedding would be "unique" and kept,
    so the embedding step must fail or drop unreadable frames instead.
    """
    x = np.asarray(embeddings)
    if x.ndim != 2 or x.shape[1] == 0:
        raise ValueError(f"embeddings must be a 2-D array (frames x dimensions), got {x.shape}")
    if frame_ids is not None and len(frame_ids) != len(x):
        raise ValueError(f"frame_ids has {len(frame_ids)} entries but embeddings has {len(x)} rows")
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.empty(len(x), dtype=np.float64)
    for start in range(0, len(x), _NORM_CHUNK):
        block = x[start : start + _NORM_CHUNK].astype(np.float64)
        norms[start : start + _NORM_CHUNK] = np.sqrt(np.einsum("ij,ij->i", block, block))
    bad = np.flatnonzero(~np.isfinite(norms) | (norms == 0))
    if len(bad):
        names = [str(frame_ids[k]) if frame_ids is not None else f"row {k}" for k in bad[:5]]
        raise ValueError(
            f"{len(bad)} embedding(s) are all zeros or not finite (first: {', '.join(names)}); "
            "the embedding step must fail or drop unreadable frames, not substitute placeholders"
        )
    if np.all(np.abs(norms - 1.0) <= _NORM_TOLERANCE):
        return x
    return (x / norms[:, None]).astype(np.float32)


class _Search:
    """Neighbour search with fixed parameters; pools pair counts and recall over its calls."""

    def __init__(self, threshold, exact_limit, nprobe, recall_sample, seed, products, colours):
        self.colours = colours
        self.cut = threshold - SIMILARITY_TOLERANCE
        self.exact_limit = exact_limit
        self.nprobe = nprobe
        self.recall_sample = recall_sample
        self.seed = seed
        self.products = products
        self.pairs_found = 0
        self.all_exact = True
        self.true_pairs = 0
        self.found_true_pairs = 0

    @property
    def recall(self) -> float | None:
        if self.all_exact or self.true_pairs == 0:
            return None
        return self.found_true_pairs / self.true_pairs

    def pairs(self, x: np.ndarray, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Pairs (a, b), a < b, of positions in `rows` that are duplicates: vectors x[rows] at or
        above the threshold and, with a colour check, frames whose colours agree."""
        found = self.similar(x, rows)
        return found if self.colours is None else self.colours.keep_agreeing(found, rows)

    def similar(self, x: np.ndarray, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Pairs (a, b), a < b, of positions in `rows` whose vectors x[rows] are at or above the
        threshold, counted in `pairs_found`."""
        for a, b in self._similar(x, rows):
            self.pairs_found += len(a)
            yield a, b

    def components(
        self, similar: Iterable[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
    ) -> np.ndarray:
        """Component label of each position of `rows`, joined by the `similar` pairs (positions
        of `rows`) that are duplicates. With a colour check, a pair is checked only while its
        frames are apart (module docstring)."""
        if self.colours is None:
            return _components(len(rows), similar)
        colours = self.colours
        return _components(len(rows), similar, agree=lambda a, b: colours.agree(rows[a], rows[b]))

    def _similar(self, x: np.ndarray, rows: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Pairs (a, b), a < b, of positions in `rows` whose vectors x[rows] are at or above the
        threshold (an approximate search's recall is measured on these)."""
        if len(rows) <= self.exact_limit:
            yield from _exact_pairs(rows, self.cut, self.products)
            return
        self.all_exact = False
        queries = _recall_queries(len(rows), self.recall_sample, self.seed)
        chunks = _approximate_pairs(x, rows, self.cut, self.nprobe, self.seed, self.products)
        if len(queries) == 0:
            yield from chunks
            return
        sampled = np.zeros(len(rows), dtype=bool)
        sampled[queries] = True
        seen_i, seen_j = [], []
        for i, j in chunks:
            touches = sampled[i] | sampled[j]
            seen_i.append(i[touches])
            seen_j.append(j[touches])
            yield i, j
        estimate = _recall(rows, self.cut, queries, _concat(seen_i), _concat(seen_j), self.products)
        self.true_pairs += estimate.true_pairs
        self.found_true_pairs += estimate.found_pairs


def _within_video_representative(
    x: np.ndarray, by_id: np.ndarray, videos: np.ndarray, quality: np.ndarray, search: _Search
) -> np.ndarray:
    """Phase 1: for every frame, the input index of the best frame of its within-video group."""
    n = len(by_id)
    order = by_id[np.argsort(videos[by_id], kind="stable")]  # by video, frame id within
    starts = np.flatnonzero(np.r_[True, videos[order][1:] != videos[order][:-1]])
    bounds = np.r_[starts, n]

    def similar():
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            rows = order[start:stop]
            for a, b in search.similar(x, rows):
                yield rows[a], rows[b]

    label = search.components(similar(), np.arange(n))
    best = _best_per_label(label, quality)
    return best[label]


def _exact_pairs(rows: np.ndarray, cut: float, products):
    """Every pair of x[rows] at >= cut, a column tile of the upper triangle at a time: positions
    (a, b), a < b."""
    n = len(rows)
    for b0 in range(0, n, TILE):
        stop = min(n, b0 + TILE)
        for a, b in _cross_pairs(rows, np.arange(stop), np.arange(b0, stop), cut, products):
            upper = a < b
            if upper.any():
                yield a[upper], b[upper]


def _approximate_pairs(x: np.ndarray, rows: np.ndarray, cut: float, nprobe: int, seed, products):
    """IVF search of x[rows] against itself, one list at a time; pairs a < b, each once.

    A vector is listed in its nearest list and probes its `nprobe` nearest. The pair {p, m} is met
    as (prober p, member m) in m's list when p probes it, and as (m, p) in p's list when m probes
    that one; when both happen the one with p < m is kept.
    """
    n = len(rows)
    # Cost per vector: `lists` centroid products plus nprobe * n / lists member products; equal at
    # sqrt(nprobe * n) lists (4 * sqrt(n) for nprobe 16).
    lists = max(1, min(n, round(math.sqrt(nprobe * n))))
    nprobe = min(nprobe, lists)
    centroids = train_centroids(x, rows, lists, seed)
    probes = products.nearest(rows, centroids, nprobe)
    flat = probes.ravel()
    entries = np.argsort(flat, kind="stable")  # grouped by list, vector order within a list
    bounds = np.searchsorted(flat[entries], np.arange(lists + 1))
    for lst in range(lists):
        entry = entries[bounds[lst] : bounds[lst + 1]]
        probers = entry // nprobe
        members = probers[entry % nprobe == 0]
        if len(members) == 0:
            continue
        for p, m in _cross_pairs(rows, probers, members, cut, products):
            mirrored = (probes[m] == probes[p, :1]).any(axis=1)
            keep = (p != m) & (~mirrored | (p < m))
            if keep.any():
                p, m = p[keep], m[keep]
                yield np.minimum(p, m), np.maximum(p, m)


def _cross_pairs(rows, left: np.ndarray, right: np.ndarray, cut: float, products):
    """Pairs (left[a], right[b]) with x[rows[left[a]]] . x[rows[right[b]]] >= cut, in blocks."""
    for a, b in products.pairs(rows[left], rows[right], cut):
        yield left[a], right[b]


def train_centroids(x: np.ndarray, rows: np.ndarray, lists: int, seed: int) -> np.ndarray:
    """FAISS spherical k-means (unit centroids, inner product) on a sample of x[rows].

    Always on the CPU, so that a GPU run searches the same lists.
    """
    faiss = load_faiss()
    rng = np.random.default_rng(seed)
    count = min(len(rows), lists * _TRAIN_POINTS_PER_LIST)
    sample = x[rows[np.sort(rng.choice(len(rows), size=count, replace=False))]]
    kmeans = faiss.Kmeans(
        x.shape[1],
        lists,
        niter=_KMEANS_ITERATIONS,
        spherical=True,
        seed=seed,
        max_points_per_centroid=_TRAIN_POINTS_PER_LIST,  # the sample is already that small
        min_points_per_centroid=1,  # a small sample is on purpose: no warning
    )
    kmeans.train(sample)
    return kmeans.centroids


def _recall_queries(n: int, sample: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 1)
    return np.sort(rng.choice(n, size=min(n, max(sample, 0)), replace=False))


def _recall(rows, cut: float, queries, found_i, found_j, products) -> Recall:
    """Exact true pairs of x[rows[queries]] against x[rows], and how many (found_i, found_j) has."""
    true_keys = []
    everything = np.arange(len(rows))
    for q, other in _cross_pairs(rows, queries, everything, cut, products):
        distinct = q != other
        true_keys.append(q[distinct].astype(np.int64) * len(rows) + other[distinct])
    true_keys = np.unique(_concat(true_keys))
    sampled = np.zeros(len(rows), dtype=bool)
    sampled[queries] = True
    found_i, found_j = np.asarray(found_i, dtype=np.int64), np.asarray(found_j, dtype=np.int64)
    from_i, from_j = sampled[found_i], sampled[found_j]
    found_keys = np.unique(
        np.r_[
            found_i[from_i] * len(rows) + found_j[from_i],
            found_j[from_j] * len(rows) + found_i[from_j],
        ]
    )
    found = int(np.count_nonzero(np.isin(true_keys, found_keys, assume_unique=True)))
    total = len(true_keys)
    return Recall(
        recall=found / total if total else None,
        true_pairs=total,
        found_pairs=found,
        queries=len(queries),
    )


def _components(
    n: int,
    edges: Iterable[tuple[np.ndarray, np.ndarray]],
    *,
    agree: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    budget: int | None = None,
) -> np.ndarray:
    """Connected-component label (0..C-1) of each of n vertices.

    Edges are taken `budget` at a time and folded into a spanning forest whenever more than
    `budget` are held, so memory stays O(n) even when a static shot makes millions of duplicate
    pairs; an edge whose ends the last fold found joined is dropped on sight, so such a shot's
    pairs cost a comparison of labels once its frames are one component. `agree(i, j)`: which
    of the remaining edges join (the colour check).
    """
    budget = max(4 * n, 1 << 16) if budget is None else budget
    held_i, held_j, held = [], [], 0
    folded = np.arange(n)  # the component labels at the last fold
    for block_i, block_j in edges:
        for start in range(0, len(block_i), budget):
            i, j = block_i[start : start + budget], block_j[start : start + budget]
            apart = folded[i] != folded[j]
            i, j = i[apart], j[apart]
            if agree is not None:
                agreeing = agree(i, j)
                i, j = i[agreeing], j[agreeing]
            held_i.append(i)
            held_j.append(j)
            held += len(i)
            if held > budget:
                folded = _labels(n, held_i, held_j)
                first = np.unique(folded, return_index=True)[1]
                vertex = np.arange(n)
                joined = vertex != first[folded]
                held_i, held_j = [vertex[joined]], [first[folded][joined]]
                held = len(held_i[0])
    return _labels(n, held_i, held_j)


def _labels(n: int, held_i: list, held_j: list) -> np.ndarray:
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import connected_components

    i, j = _concat(held_i), _concat(held_j)
    graph = coo_array((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1].astype(np.int64)


def _best_per_label(label: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """best[g]: the vertex with the lowest quality rank among those labelled g (labels 0..G-1)."""
    order = np.lexsort((quality, label))
    sorted_label = label[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_label[1:] != sorted_label[:-1]
    return order[first]


def _quality_rank(ids: np.ndarray, id_rank: np.ndarray, scores, sharpness) -> np.ndarray:
    """0 for the best frame: highest score, then highest sharpness, then smallest frame id."""
    n = len(ids)
    score = _per_frame_array("scores", scores, n).astype(np.float64)
    sharp = _per_frame_array("sharpness", sharpness, n).astype(np.float64)
    for name, values in (("scores", score), ("sharpness", sharp)):
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            raise ValueError(f"{name} must be finite; frame {ids[bad[0]]} has {values[bad[0]]}")
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((id_rank, -sharp, -score))] = np.arange(n)
    return rank


def _frame_order(frame_ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Frame ids as a string array, and the indices that sort them; ids must be unique."""
    ids = np.asarray([str(f) for f in frame_ids], dtype=str)
    by_id = np.argsort(ids, kind="stable")
    ordered = ids[by_id]
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    if len(repeated):
        raise ValueError(f"frame ids must be unique; repeated: {', '.join(repeated[:5])}")
    return ids, by_id


def _per_frame_array(name: str, values, n: int) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (n,):
        raise ValueError(f"{name} must have one entry per frame ({n}), got shape {array.shape}")
    return array


def _check_threshold(threshold: float) -> None:
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be a cosine similarity in (0, 1], got {threshold}")


def _check_search_parameters(threshold: float, exact_limit: int, nprobe: int) -> None:
    _check_threshold(threshold)
    if exact_limit < 1:
        raise ValueError(f"exact_limit must be at least 1, got {exact_limit}")
    if nprobe < 1:
        raise ValueError(f"nprobe must be at least 1, got {nprobe}")


def _concat(parts: list) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, dtype=np.int64)
