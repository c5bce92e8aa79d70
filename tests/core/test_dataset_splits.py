"""Splits by source (assets/dataset/dataset_splits.py): no video, no copy and no near-duplicate group spans
two splits; the same inputs give the same splits whatever their order; every split with a share
has images when there are enough source units, and a warning names the empty ones otherwise."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataminer_dagster.assets.dataset.dataset_splits import (
    SPLITS,
    assign_splits,
    pairs_across_splits,
    shared_group_links,
    source_units,
)

RATIOS = {"train": 0.8, "val": 0.1, "test": 0.1}

videos = st.dictionaries(
    st.text("abcdefghij", min_size=1, max_size=3), st.integers(0, 40), min_size=0, max_size=30
)
ratios = st.sampled_from(
    [
        RATIOS,
        {"train": 0.7, "val": 0.3, "test": 0.0},
        {"train": 1.0},
        {"train": 0.34, "val": 0.33, "test": 0.33},
    ]
)


@st.composite
def projects(draw):
    images = draw(videos)
    names = sorted(images) + ["x_no_images"]  # a video whose frames dedup dropped, a bridge
    links = draw(
        st.lists(st.tuples(st.sampled_from(names), st.sampled_from(names)), max_size=15)
        if names
        else st.just([])
    )
    return images, links, draw(ratios), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=300, deadline=None)
@given(projects())
def test_no_source_unit_spans_two_splits_and_the_splits_hold_every_image(project):
    images, links, shares, seed = project
    result = assign_splits(images, links, shares, seed)

    with_images = {v for v, n in images.items() if n}
    assert set(result.split_of) == with_images
    for unit in source_units(images, links):
        assert len({result.split_of[v] for v in unit if v in with_images}) <= 1, unit
    for a, b in links:  # a link between two videos with images, so one split for both
        if a in with_images and b in with_images:
            assert result.split_of[a] == result.split_of[b]
    assert sum(result.images.values()) == sum(images.values())
    for split in SPLITS:
        assert result.images[split] == sum(
            images[v] for v, s in result.split_of.items() if s == split
        )
        if shares.get(split, 0) == 0:
            assert result.images[split] == 0


@settings(max_examples=300, deadline=None)
@given(projects())
def test_every_split_with_a_share_has_images_when_there_are_enough_units(project):
    images, links, shares, seed = project
    result = assign_splits(images, links, shares, seed)

    units = [u for u in source_units(images, links) if sum(images.get(v, 0) for v in u)]
    wanted = [s for s in SPLITS if shares.get(s, 0) > 0]
    empty = [s for s in wanted if not result.images[s]]
    if len(units) >= len(wanted):
        assert empty == [] and result.warnings == ()
    else:
        assert empty, "fewer units than splits leaves a split empty"
        (warning,) = result.warnings
        assert all(f"dataset.splits.{s}" in warning for s in empty)
        assert f"{len(units)} source unit" in warning


@settings(max_examples=200, deadline=None)
@given(projects(), st.randoms(use_true_random=False))
def test_the_same_inputs_in_any_order_give_the_same_splits(project, rng):
    images, links, shares, seed = project
    first = assign_splits(images, links, shares, seed)
    shuffled_videos = list(images.items())
    rng.shuffle(shuffled_videos)
    shuffled_links = [(b, a) if rng.random() < 0.5 else (a, b) for a, b in links]
    rng.shuffle(shuffled_links)

    again = assign_splits(dict(shuffled_videos), shuffled_links, shares, seed)
    assert again == first


def test_many_equal_videos_are_split_by_their_shares_and_the_seed_changes_which():
    images = {f"v{i:03d}": 10 for i in range(100)}
    one = assign_splits(images, [], RATIOS, seed=0)
    assert one.images == {"train": 800, "val": 100, "test": 100}
    assert one.units == {"train": 80, "val": 10, "test": 10}
    other = assign_splits(images, [], RATIOS, seed=1)
    assert other.images == one.images and other.split_of != one.split_of


def test_videos_linked_by_a_near_duplicate_group_or_a_copy_stay_together():
    images = {"a": 5, "b": 5, "c": 5, "d": 5, "e": 5, "f": 5}
    # frames of a and b share group 7; c is a copy of d; e and f are alone
    groups = [("a", 7), ("a", 8), ("b", 7), ("c", 9), ("e", -1), ("f", -1), ("e", 10)]
    links = shared_group_links(groups) + [("c", "d")]
    assert links[0] == ("a", "b")
    for seed in range(20):
        result = assign_splits(images, links, RATIOS, seed)
        assert result.split_of["a"] == result.split_of["b"]
        assert result.split_of["c"] == result.split_of["d"]
        assert pairs_across_splits(groups, result.split_of) == 0
        assert all(result.images[s] for s in SPLITS)  # 4 units for 3 splits


def test_unreadable_frames_link_nothing():
    """Group -1 marks frames dedup could not read: they are in no group together."""
    assert shared_group_links([("a", -1), ("b", -1), ("c", 3), ("c", 3)]) == []


def test_pairs_across_splits_counts_frame_pairs_of_a_group_in_two_splits():
    rows = [("a", 1), ("a", 1), ("b", 1), ("c", 2), ("d", 2), ("gone", 2), ("x", -1), ("y", -1)]
    split_of = {"a": "train", "b": "val", "c": "test", "d": "test", "x": "train", "y": "val"}
    # group 1: a, a in train and b in val: 2 pairs; group 2 in one split; "gone" has no split
    assert pairs_across_splits(rows, split_of) == 2
    # as read from the dedup table: NumPy integers, -1 for the unreadable frames
    table = [(v, np.int64(g)) for v, g in rows]
    assert pairs_across_splits(table, split_of) == 2
    assert shared_group_links(table) == [("a", "b"), ("c", "d"), ("c", "gone")]


def test_too_few_videos_leave_splits_empty_with_a_warning_and_no_error():
    result = assign_splits({"only": 12}, [], RATIOS, seed=3)
    assert result.images == {"train": 12, "val": 0, "test": 0}
    (warning,) = result.warnings
    assert "the val and test splits are empty" in warning
    assert "1 source unit (" in warning
    assert "dataset.splits.val and dataset.splits.test to 0" in warning

    nothing = assign_splits({}, [], RATIOS, seed=3)
    assert nothing.images == dict.fromkeys(SPLITS, 0) and nothing.warnings


def test_a_large_unit_does_not_starve_the_other_splits():
    """One video with most of the images and three small ones: every split gets one."""
    images = {"big": 1000, "s1": 3, "s2": 3, "s3": 3}
    for seed in range(30):
        result = assign_splits(images, [], RATIOS, seed)
        assert all(result.images[s] for s in SPLITS), (seed, result)
        assert result.split_of["big"] == "train"


@pytest.mark.parametrize("seed", [0, 5])
def test_units_are_the_connected_components(seed):
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(12)]
    links = [("v0", "v1"), ("v1", "v2"), ("v5", "v4"), ("v9", "v9")]
    rng.shuffle(links)
    units = source_units(names, links)
    assert ("v0", "v1", "v2") in units and ("v4", "v5") in units and ("v9",) in units
    assert sorted(v for u in units for v in u) == sorted(names)
