"""The kept frames of a project's dedup, kept on disk for incremental dedup: new frames are
compared with these and with each other, not the whole project again.

An index is a folder of segments, each a batch of kept frames' unit embeddings (float32) with
their frame ids (and, under dedup.colour_overlap, their colour histograms), written once and never
changed. A kept frame that a better duplicate replaced
(`replacements`, dedup.replace: better) stays in the index: it still stands for its group, and the
replacement is added beside it. Adding kept frames writes a new segment; past
MAX_SEGMENTS the segments are merged into one. Vectors are memory-mapped when searched, so a
search reads only what it multiplies.

Search is exact (every new vector against every kept one) while the index holds at most
`exact_limit` vectors. Beyond, it is an inverted file: the index trains centroids (FAISS spherical
k-means, as assets/dedup/grouping.py does) when it first outgrows the exact search and again when it has
grown RETRAIN_GROWTH times since; each segment stores its vectors sorted by nearest centroid,
and a query is compared with the members of its `nprobe` nearest lists, list by list (all the
queries that probe a list in one block of products). It may miss a kept duplicate (the new frame
is then kept too); it never reports a pair below the threshold, nor, with a colour check, one whose
colours disagree.

Every change is staged in a new folder beside the index (earlier segments hard-linked into it,
never rewritten) and published by the caller with `core.files.publish`, so a crash leaves the
earlier index as it was.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dataminer_dagster.assets.dedup.colour_check import ColourCheck
from dataminer_dagster.assets.dedup.grouping import (
    SIMILARITY_TOLERANCE,
    deduplicate,
    normalized,
    train_centroids,
)
from dataminer_dagster.assets.dedup.pair_search import load_faiss

MANIFEST = "index.json"
MAX_SEGMENTS = 8
RETRAIN_GROWTH = 4  # the centroids are trained again when the index grew this many times
_QUERY_BLOCK = 4096
_KEPT_BLOCK = 65536


@dataclass(frozen=True)
class Matches:
    """For each query: the best kept frame at or above the threshold, or -1."""

    kept_row: np.ndarray  # int64 position in `KeptIndex.frame_ids()`, -1: no duplicate kept
    similarity: np.ndarray  # float32, that pair's similarity (nan where none)
    exact: bool


@dataclass(frozen=True)
class Placement:
    """Where each new frame goes (arrays per new frame, in input order)."""

    joins: np.ndarray  # the kept frame id it duplicates ("" where none: it is grouped anew)
    group: np.ndarray  # int64 group among the frames that join none (0..G-1), -1 for the others
    is_representative: np.ndarray  # bool: kept, the best of its new group
    pairs_found: int  # similar pairs among the new frames (the colour check may part some)
    exact: bool  # both searches were exact


def place_new_frames(
    index: KeptIndex,
    embeddings: np.ndarray,
    *,
    frame_ids: Sequence[str],
    video_ids: Sequence[str],
    scores: np.ndarray,
    sharpness: np.ndarray,
    threshold: float,
    exact_limit: int,
    device: str = "auto",
    colours: ColourCheck | None = None,
) -> Placement:
    """Incremental dedup: a new frame that duplicates a kept one joins its group (the kept frame
    stays kept: a dataset does not reshuffle when it grows); the others are grouped among
    themselves as `deduplicate` groups a project, and the best of each of their groups is kept.
    `colours`: the new frames' histograms, when duplicates' colours must agree too."""
    n = len(frame_ids)
    matches = index.search(embeddings, threshold, exact_limit=exact_limit, colours=colours)
    joined = matches.kept_row >= 0
    joins = np.full(n, "", dtype=object)
    if joined.any():
        joins[joined] = index.frame_ids()[matches.kept_row[joined]]
    group = np.full(n, -1, dtype=np.int64)
    keep = np.zeros(n, dtype=bool)
    rest = np.flatnonzero(~joined)
    pairs, exact = 0, matches.exact
    if len(rest):
        result = deduplicate(
            np.asarray(embeddings)[rest],
            frame_ids=[frame_ids[i] for i in rest],
            video_ids=[video_ids[i] for i in rest],
            scores=np.asarray(scores)[rest],
            sharpness=np.asarray(sharpness)[rest],
            threshold=threshold,
            exact_limit=exact_limit,
            device=device,
            colours=None if colours is None else colours.subset(rest),
        )
        group[rest] = result.group
        keep[rest] = result.is_representative
        pairs, exact = result.pairs_found, exact and result.exact
    return Placement(joins.astype(str), group, keep, pairs, exact)


def replacements(
    joined_group: np.ndarray,
    scores: np.ndarray,
    sharpness: np.ndarray,
    kept_score: Mapping[int, float],
    margin: float,
) -> dict[int, int]:
    """{group: the new frame (its position) that takes the place of the group's kept frame}.

    `joined_group` gives, per new frame, the earlier group it joined (-1: none). Of the new frames
    that joined a group, the best (highest score, then sharpness: the order a full dedup keeps)
    replaces the group's kept frame, whose score is `kept_score[group]`, when its own is higher
    by more than `margin`."""
    best: dict[int, int] = {}
    for position in np.flatnonzero(joined_group >= 0):
        group = int(joined_group[position])
        other = best.get(group)
        if other is None or (scores[position], sharpness[position]) > (
            scores[other],
            sharpness[other],
        ):
            best[group] = int(position)
    return {
        group: position
        for group, position in best.items()
        if scores[position] > kept_score[group] + margin
    }


class KeptIndex:
    """A published index (read only). `version` names the dedup settings it was built under."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / MANIFEST).read_text())

    @classmethod
    def open(cls, folder: Path, version: str) -> KeptIndex | None:
        """The index in `folder` when it was built under `version`; None otherwise (no index, an
        unreadable one, or other settings: the caller deduplicates from scratch)."""
        try:
            index = cls(folder)
        except (OSError, ValueError):
            return None
        return index if index.manifest.get("version") == version else None

    @property
    def version(self) -> str:
        return self.manifest["version"]

    @property
    def size(self) -> int:
        return sum(s["rows"] for s in self.manifest["segments"])

    @property
    def dimensions(self) -> int:
        return self.manifest["dimensions"]

    def frame_ids(self) -> np.ndarray:
        """The kept frames' ids, segment by segment in list order: row r of every search."""
        parts = [
            np.load(self.folder / s["name"] / "frame_ids.npy") for s in self.manifest["segments"]
        ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=str)

    def vectors(self) -> np.ndarray:
        """Every kept vector, in `frame_ids` order (read whole: for a rebuild)."""
        parts = [self._segment(s)[0] for s in self.manifest["segments"]]
        if not parts:
            return np.empty((0, self.dimensions), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts))

    def colours(self) -> np.ndarray | None:
        """Every kept frame's colour histogram, in `frame_ids` order; None when the index has
        none (built without the colour check)."""
        parts = [self._segment(s)[2] for s in self.manifest["segments"]]
        if not parts or any(part is None for part in parts):
            return None
        return np.ascontiguousarray(np.concatenate(parts))

    def search(
        self,
        queries: np.ndarray,
        threshold: float,
        *,
        exact_limit: int,
        nprobe: int = 16,
        colours: ColourCheck | None = None,
    ) -> Matches:
        """The best kept duplicate of each row of `queries` (unit vectors); with `colours` (the
        queries' histograms), the best whose colours agree."""
        q = normalized(queries)
        cut = np.float32(threshold - SIMILARITY_TOLERANCE)
        best = np.full(len(q), -1, dtype=np.int64)
        score = np.full(len(q), -np.inf, dtype=np.float32)
        centroids = self._centroids()
        exact = centroids is None or self.size <= exact_limit
        probes = None if exact else _nearest(q, centroids, min(nprobe, len(centroids)))
        offset = 0
        for segment in self.manifest["segments"]:
            vectors, bounds, kept_colours = self._segment(segment)
            veto = None
            if colours is not None:
                if kept_colours is None:
                    raise ValueError(
                        f"the kept index {self.folder} holds no colour histograms; "
                        "`dataminer force-dedup` deduplicates the project again"
                    )
                veto = _ColourVeto(colours, kept_colours, cut)
            if exact:
                _exact_best(q, vectors, offset, best, score, veto)
            else:
                _listed_best(q, probes, vectors, bounds, offset, best, score, veto)
            offset += segment["rows"]
        found = score >= cut
        best[~found] = -1
        return Matches(best, np.where(found, score, np.nan).astype(np.float32), exact)

    def _centroids(self) -> np.ndarray | None:
        return np.load(self.folder / "centroids.npy") if self.manifest.get("centroids") else None

    def _segment(self, segment: dict) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """A segment's vectors, its list bounds (None: no lists) and its colour histograms (None:
        no colour check), the arrays memory-mapped."""
        folder = self.folder / segment["name"]
        vectors = np.load(folder / "vectors.npy", mmap_mode="r")
        bounds_path, colours_path = folder / "bounds.npy", folder / "colours.npy"
        return (
            vectors,
            np.load(bounds_path) if bounds_path.exists() else None,
            np.load(colours_path, mmap_mode="r") if colours_path.exists() else None,
        )


class IndexWriter:
    """Builds the next version of an index in a staging folder beside `folder`."""

    def __init__(self, folder: Path, staging: Path):
        self.folder = Path(folder)
        self.staging = Path(staging)

    def rebuild(
        self,
        vectors: np.ndarray,
        frame_ids: Sequence[str],
        version: str,
        *,
        exact_limit: int,
        colours: np.ndarray | None = None,
        nprobe: int = 16,
        seed: int = 0,
    ) -> Path:
        """A new index of exactly these kept frames (a full dedup, or a merge), with their colour
        histograms when the colour check is on."""
        x = normalized(vectors) if len(vectors) else np.asarray(vectors, dtype=np.float32)
        centroids = None
        if len(x) > exact_limit:
            lists = max(1, round(math.sqrt(nprobe * len(x))))
            centroids = _train(x, lists, seed)
        self._fresh()
        manifest = {
            "version": version,
            "dimensions": int(x.shape[1]) if x.ndim == 2 else 0,
            "centroids": centroids is not None,
            "trained_on": len(x),
            "segments": [],
            "next_segment": 0,
        }
        if centroids is not None:
            np.save(self.staging / "centroids.npy", centroids)
        if len(x):
            manifest["segments"].append(
                self._write_segment(manifest, x, frame_ids, centroids, colours)
            )
        self._write_manifest(manifest)
        return self.staging

    def add(
        self,
        index: KeptIndex,
        vectors: np.ndarray,
        frame_ids: Sequence[str],
        *,
        exact_limit: int,
        colours: np.ndarray | None = None,
        nprobe: int = 16,
        seed: int = 0,
    ) -> Path:
        """The index with these kept frames (and their colour histograms, with the colour check)
        added: a new segment, or a rebuild when the index outgrows its centroids (or the exact
        search) or holds MAX_SEGMENTS segments."""
        x = normalized(vectors)
        manifest = dict(index.manifest)
        total = index.size + len(x)
        trained_on = manifest.get("trained_on", 0)
        outgrown = (not manifest["centroids"] and total > exact_limit) or (
            manifest["centroids"] and total > RETRAIN_GROWTH * max(trained_on, 1)
        )
        if outgrown or len(manifest["segments"]) >= MAX_SEGMENTS:
            everything = np.concatenate([index.vectors(), x])
            ids = np.concatenate([index.frame_ids(), np.asarray(frame_ids, dtype=str)])
            all_colours = None if colours is None else np.concatenate([index.colours(), colours])
            return self.rebuild(
                everything,
                ids,
                index.version,
                exact_limit=exact_limit,
                colours=all_colours,
                nprobe=nprobe,
                seed=seed,
            )
        self._fresh()
        for source in index.folder.iterdir():  # earlier segments are shared, never rewritten
            if source.name == MANIFEST:
                continue
            if source.is_dir():
                _link_tree(source, self.staging / source.name)
            else:
                os.link(source, self.staging / source.name)
        centroids = index._centroids()
        manifest["segments"] = [*manifest["segments"]]
        manifest["segments"].append(self._write_segment(manifest, x, frame_ids, centroids, colours))
        self._write_manifest(manifest)
        return self.staging

    def _fresh(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)

    def _write_segment(
        self, manifest: dict, x: np.ndarray, frame_ids, centroids, colours: np.ndarray | None
    ) -> dict:
        name = f"segment-{manifest['next_segment']:06d}"
        manifest["next_segment"] += 1
        folder = self.staging / name
        folder.mkdir()
        ids = np.asarray(frame_ids, dtype=str)
        order = np.arange(len(x))
        if centroids is not None:
            lists = _nearest(x, centroids, 1)[:, 0]
            order = np.argsort(lists, kind="stable")
            np.save(
                folder / "bounds.npy", np.searchsorted(lists[order], np.arange(len(centroids) + 1))
            )
        np.save(folder / "vectors.npy", np.ascontiguousarray(x[order], dtype=np.float32))
        np.save(folder / "frame_ids.npy", ids[order])
        if colours is not None:
            np.save(folder / "colours.npy", np.ascontiguousarray(colours[order], dtype=np.float32))
        return {"name": name, "rows": len(x)}

    def _write_manifest(self, manifest: dict) -> None:
        (self.staging / MANIFEST).write_text(json.dumps(manifest))


def _link_tree(source: Path, target: Path) -> None:
    target.mkdir()
    for entry in source.iterdir():
        os.link(entry, target / entry.name)


def _train(x: np.ndarray, lists: int, seed: int) -> np.ndarray:
    """Centroids of the kept vectors, as the full dedup trains its lists."""
    return train_centroids(x, np.arange(len(x)), lists, seed)


def _nearest(x: np.ndarray, centroids: np.ndarray, k: int) -> np.ndarray:
    faiss = load_faiss()
    index = faiss.IndexFlatIP(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, dtype=np.float32))
    return index.search(np.ascontiguousarray(x, dtype=np.float32), k)[1]


class _ColourVeto:
    """Drops the products of (query, kept frame) pairs at or above the cut whose colours
    disagree, so that the best match left is one whose colours agree."""

    def __init__(self, colours: ColourCheck, kept_colours: np.ndarray, cut: np.float32):
        self.colours = colours
        self.kept_colours = kept_colours
        self.cut = cut

    def __call__(self, products: np.ndarray, queries: np.ndarray, kept: np.ndarray) -> None:
        """`products[a, b]` is query `queries[a]` against the segment's kept row `kept[b]`."""
        a, b = np.nonzero(products >= self.cut)
        disagree = ~self.colours.agree_with(self.kept_colours, queries[a], kept[b])
        products[a[disagree], b[disagree]] = -np.inf


def _exact_best(q, vectors, offset, best, score, veto: _ColourVeto | None) -> None:
    for start in range(0, len(vectors), _KEPT_BLOCK):
        block = np.asarray(vectors[start : start + _KEPT_BLOCK])
        for qs in range(0, len(q), _QUERY_BLOCK):
            products = q[qs : qs + _QUERY_BLOCK] @ block.T
            if veto is not None:
                veto(products, np.arange(qs, qs + len(products)), start + np.arange(len(block)))
            _take_better(products, qs, offset + start, best, score)


def _listed_best(q, probes, vectors, bounds, offset, best, score, veto: _ColourVeto | None) -> None:
    flat = probes.ravel()
    entries = np.argsort(flat, kind="stable")
    starts = np.searchsorted(flat[entries], np.arange(len(bounds)))
    for lst in np.unique(flat):
        queries = entries[starts[lst] : starts[lst + 1]] // probes.shape[1]
        first, stop = int(bounds[lst]), int(bounds[lst + 1])
        if stop == first:
            continue
        members = np.asarray(vectors[first:stop])
        products = q[queries] @ members.T
        if veto is not None:
            veto(products, queries, np.arange(first, stop))
        column = np.argmax(products, axis=1)
        value = products[np.arange(len(queries)), column]
        better = value > score[queries]
        score[queries[better]] = value[better]
        best[queries[better]] = offset + first + column[better]


def _take_better(products, query_start, kept_start, best, score) -> None:
    column = np.argmax(products, axis=1)
    value = products[np.arange(len(products)), column]
    rows = np.arange(query_start, query_start + len(products))
    better = value > score[rows]
    score[rows[better]] = value[better]
    best[rows[better]] = kept_start + column[better]
