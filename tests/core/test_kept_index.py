"""The on-disk index of kept frames that incremental dedup compares new frames with."""

from __future__ import annotations

import numpy as np
import pytest

from dataminer_dagster.assets.dedup.kept_index import (
    MAX_SEGMENTS,
    IndexWriter,
    KeptIndex,
    replacements,
)
from dataminer_dagster.core.files import publish, staging_path


def unit(rng, n: int, d: int = 32) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def near(rng, x: np.ndarray, noise: float = 0.05) -> np.ndarray:
    y = x + noise * rng.standard_normal(x.shape).astype(np.float32) / np.sqrt(x.shape[1])
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def build(folder, vectors, ids, version="v1", exact_limit=10_000):
    staged = IndexWriter(folder, staging_path(folder)).rebuild(
        vectors, ids, version, exact_limit=exact_limit
    )
    publish(staged, folder)
    return KeptIndex.open(folder, version)


def grow(folder, index, vectors, ids, exact_limit=10_000):
    staged = IndexWriter(folder, staging_path(folder)).add(
        index, vectors, ids, exact_limit=exact_limit
    )
    publish(staged, folder)
    return KeptIndex.open(folder, index.version)


@pytest.mark.parametrize("exact_limit", [10_000, 100])  # exact search, then lists
def test_a_search_finds_the_kept_duplicate_of_each_new_frame(tmp_path, exact_limit):
    rng = np.random.default_rng(0)
    kept = unit(rng, 2000)
    ids = [f"f{i:05d}" for i in range(2000)]
    index = build(tmp_path / "index", kept, ids, exact_limit=exact_limit)
    assert index.size == 2000

    duplicates = near(rng, kept[:50])
    fresh = unit(rng, 50)
    matches = index.search(np.r_[duplicates, fresh], 0.9, exact_limit=exact_limit)

    assert matches.exact == (exact_limit >= 2000)
    found = index.frame_ids()[matches.kept_row[:50]]
    assert list(found) == ids[:50]
    assert (matches.kept_row[50:] == -1).all() and np.isnan(matches.similarity[50:]).all()
    assert (matches.similarity[:50] >= 0.9).all()


def test_frames_added_are_searched_and_earlier_segments_are_not_rewritten(tmp_path):
    rng = np.random.default_rng(1)
    folder = tmp_path / "index"
    index = build(folder, unit(rng, 300), [f"a{i}" for i in range(300)], exact_limit=100)
    first = next(folder.glob("segment-*/vectors.npy"))
    inode = first.stat().st_ino
    later = unit(rng, 40)
    index = grow(folder, index, later, [f"b{i}" for i in range(40)], exact_limit=100)

    assert index.size == 340 and len(index.manifest["segments"]) == 2
    assert (folder / first.relative_to(folder)).stat().st_ino == inode  # linked, not copied
    matches = index.search(near(rng, later), 0.9, exact_limit=100)
    assert sorted(index.frame_ids()[matches.kept_row]) == sorted(f"b{i}" for i in range(40))


def test_segments_are_merged_and_centroids_trained_again_as_the_index_grows(tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "index"
    index = build(folder, unit(rng, 50), [f"s0-{i}" for i in range(50)], exact_limit=120)
    assert not index.manifest["centroids"]  # small: exact search, no lists
    for batch in range(1, MAX_SEGMENTS + 2):
        index = grow(
            folder, index, unit(rng, 20), [f"s{batch}-{i}" for i in range(20)], exact_limit=120
        )
    assert index.manifest["centroids"]  # outgrew the exact search: rebuilt with lists
    assert len(index.manifest["segments"]) <= MAX_SEGMENTS
    assert index.size == 50 + 20 * (MAX_SEGMENTS + 1)
    assert len(set(index.frame_ids())) == index.size
    everything = index.vectors()
    matches = index.search(everything, 0.99, exact_limit=120)
    assert (index.frame_ids()[matches.kept_row] == index.frame_ids()).mean() > 0.95


def test_an_index_of_other_settings_or_none_at_all_is_not_used(tmp_path):
    rng = np.random.default_rng(3)
    build(tmp_path / "index", unit(rng, 10), [str(i) for i in range(10)], version="threshold-0.9")
    assert KeptIndex.open(tmp_path / "index", "threshold-0.95") is None
    assert KeptIndex.open(tmp_path / "nothing", "threshold-0.9") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "index.json").write_text("{not json")
    assert KeptIndex.open(tmp_path / "broken", "threshold-0.9") is None


def test_the_best_new_duplicate_replaces_a_kept_frame_only_past_the_margin():
    # new frames 0-1 join group 7, 2 joins group 8, 3 joins group 9, 4 is grouped anew
    joined = np.array([7, 7, 8, 9, -1])
    scores = np.array([0.60, 0.70, 0.51, 0.90, 0.99])
    sharpness = np.array([1.0, 1.0, 9.0, 1.0, 1.0])
    kept_score = {7: 0.65, 8: 0.50, 9: 0.95}
    # group 7: the better of its two new frames (1) beats 0.65 by 0.05; group 8: 0.51 is not
    # 0.02 above 0.50; group 9: no new frame is better; frame 4 joined no group
    assert replacements(joined, scores, sharpness, kept_score, margin=0.02) == {7: 1}
    assert replacements(joined, scores, sharpness, kept_score, margin=0.0) == {7: 1, 8: 2}
    # equal scores: the sharper new frame is the group's best
    tie = replacements(np.array([7, 7]), np.array([0.8, 0.8]), np.array([1.0, 2.0]), {7: 0.5}, 0.0)
    assert tie == {7: 1}
