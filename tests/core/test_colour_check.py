"""The colour check of dedup (dedup.colour_overlap): frames whose embeddings are alike are
duplicates only when their colours agree, in the full grouping (exact and approximate search), the
incremental placement against the kept index, and the check of the kept frames."""

from __future__ import annotations

import numpy as np
import pytest

from dataminer_dagster.assets.dedup.colour_check import (
    BINS,
    HISTOGRAM_SLUG,
    ColourCheck,
    colour_histogram,
    histograms_from_cache,
    overlap,
)
from dataminer_dagster.assets.dedup.grouping import deduplicate, similar_pairs
from dataminer_dagster.assets.dedup.kept_index import (
    MAX_SEGMENTS,
    IndexWriter,
    KeptIndex,
    place_new_frames,
)
from dataminer_dagster.core.embedding_cache import EmbeddingCache
from dataminer_dagster.core.files import publish, staging_path
from dataminer_dagster.core.images import ImageReadError, write_image


def picture(background, square, seed: int = 0) -> np.ndarray:
    """A 64 x 48 BGR picture: a noisy background of one colour with a square of another."""
    rng = np.random.default_rng(seed)
    image = np.empty((48, 64, 3), np.uint8)
    image[:] = background
    image[10:30, 8:28] = square
    noise = rng.integers(-6, 7, size=image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def shares(cells: dict[int, float]) -> np.ndarray:
    """A histogram with these shares in these cells."""
    histogram = np.zeros(BINS**3, np.float32)
    for cell, share in cells.items():
        histogram[cell] = share
    return histogram


RED, BLUE = shares({5: 0.8, 300: 0.2}), shares({40: 0.8, 300: 0.2})  # overlap 0.2


def alike(n: int, dimensions: int = 16, seed: int = 0) -> np.ndarray:
    """n unit vectors all within a cosine of 0.99 of each other: one group by embedding."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(dimensions)
    x = base + 0.01 * rng.standard_normal((n, dimensions))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def test_a_mirrored_or_re_encoded_frame_keeps_its_colours_and_another_scene_does_not(tmp_path):
    scene = picture((40, 160, 30), (200, 60, 30))
    other = picture((150, 40, 160), (200, 60, 30), seed=1)
    files = {
        "scene.png": scene,
        "mirrored.png": scene[:, ::-1],
        "re-encoded.jpg": scene,
        "other.png": other,
    }
    for name, image in files.items():
        write_image(tmp_path / name, image)
    histogram = {name: colour_histogram(tmp_path / name) for name in files}
    assert histogram["scene.png"].shape == (BINS**3,)
    assert histogram["scene.png"].sum() == pytest.approx(1.0)

    def agreement(a: str, b: str) -> float:
        return float(overlap(histogram[a][None], histogram[b][None])[0])

    assert agreement("scene.png", "mirrored.png") == pytest.approx(1.0)
    assert agreement("scene.png", "re-encoded.jpg") > 0.9
    assert agreement("scene.png", "other.png") < 0.4

    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ImageReadError, match="empty"):
        colour_histogram(tmp_path / "empty.jpg")


def test_histograms_come_back_from_the_embedding_cache_as_shares(tmp_path):
    histograms = np.stack([RED, BLUE, shares({7: 0.999, 8: 0.001})])
    cache = EmbeddingCache(tmp_path, HISTOGRAM_SLUG)
    cache.put("video", ["a", "b", "c"], histograms)
    found, rows = cache.get("video", ["a", "b", "c"])
    assert found.all()
    back = histograms_from_cache(rows)
    np.testing.assert_allclose(back.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(back, histograms, atol=2e-3)


@pytest.mark.parametrize("exact_limit", [10_000, 50], ids=["exact", "approximate"])
def test_frames_the_embedding_joins_stay_apart_when_their_colours_disagree(exact_limit):
    """Four videos of one look to the embedding; half their frames are red, half blue. Without
    the check every frame is one group; with it, red and blue frames are never in one group,
    within a video or across videos, and each colour keeps one frame."""
    n = 400
    x = alike(n)
    red = np.arange(n) % 2 == 0
    histograms = np.where(red[:, None], RED, BLUE)
    arguments = dict(
        frame_ids=[f"v{i % 4}_{i:06d}" for i in range(n)],
        video_ids=[f"v{i % 4}" for i in range(n)],
        scores=np.linspace(0.5, 0.9, n),
        sharpness=np.ones(n),
        threshold=0.95,
        exact_limit=exact_limit,
    )
    without = deduplicate(x, **arguments)
    assert without.kept == 1

    result = deduplicate(x, **arguments, colours=ColourCheck(histograms, 0.8))
    assert result.kept == 2
    assert len(set(result.group[red])) == 1 and len(set(result.group[~red])) == 1
    assert result.group[red][0] != result.group[~red][0]
    assert result.exact == (exact_limit >= n // 4)  # a video's frames
    # An approximate search's recall is of the embedding's pairs, the same with the check or not.
    assert result.recall == without.recall and (result.recall is None) == result.exact
    assert result.pairs_found == without.pairs_found  # similar pairs, the colours parted some


def test_pairs_of_kept_frames_are_counted_only_when_their_colours_agree():
    x = alike(6)
    histograms = np.stack([RED, BLUE, RED, BLUE, BLUE, RED])
    left, right = similar_pairs(x, 0.95, colours=ColourCheck(histograms, 0.8))
    assert list(zip(left.tolist(), right.tolist(), strict=True)) == [
        (0, 2),
        (0, 5),
        (1, 3),
        (1, 4),
        (2, 5),
        (3, 4),
    ]
    assert len(similar_pairs(x, 0.95)[0]) == 15


def build(folder, vectors, ids, colours, exact_limit):
    staged = IndexWriter(folder, staging_path(folder)).rebuild(
        vectors, ids, "v1", exact_limit=exact_limit, colours=colours
    )
    publish(staged, folder)
    return KeptIndex.open(folder, "v1")


@pytest.mark.parametrize("exact_limit", [10_000, 50], ids=["exact", "lists"])
def test_a_new_frame_joins_the_best_kept_frame_whose_colours_agree(tmp_path, exact_limit):
    """Kept frame 'red' is the new frame's nearest by embedding, 'blue' a little farther: a blue
    new frame joins 'blue'; with no colour check, it joins 'red'."""
    rng = np.random.default_rng(5)
    others = rng.standard_normal((300, 16)).astype(np.float32)
    others /= np.linalg.norm(others, axis=1, keepdims=True)
    query = alike(1, seed=9)
    aside = rng.standard_normal(query.shape).astype(np.float32)
    aside -= (aside @ query[0]) * query  # orthogonal to the query
    aside /= np.linalg.norm(aside)

    def at_cosine(cosine: float) -> np.ndarray:
        return cosine * query + np.sqrt(1 - cosine**2) * aside

    kept = np.concatenate([at_cosine(0.99), at_cosine(0.97), others]).astype(np.float32)
    ids = ["red", "blue", *(f"o{i}" for i in range(300))]
    colours = np.concatenate([[RED, BLUE], np.tile(RED, (300, 1))])
    index = build(tmp_path / "index", kept, ids, colours, exact_limit)

    plain = index.search(query, 0.95, exact_limit=exact_limit)
    checked = index.search(
        query, 0.95, exact_limit=exact_limit, colours=ColourCheck(BLUE[None], 0.8)
    )
    green = index.search(
        query, 0.95, exact_limit=exact_limit, colours=ColourCheck(shares({99: 1.0})[None], 0.8)
    )
    assert plain.exact == (exact_limit >= index.size)
    assert index.frame_ids()[plain.kept_row[0]] == "red"
    assert index.frame_ids()[checked.kept_row[0]] == "blue"
    assert checked.similarity[0] == pytest.approx(0.97, abs=1e-5)
    assert green.kept_row[0] == -1 and np.isnan(green.similarity[0])

    placed = place_new_frames(
        index,
        np.concatenate([query, query]),
        frame_ids=["n0", "n1"],
        video_ids=["new", "new"],
        scores=np.array([0.5, 0.6]),
        sharpness=np.ones(2),
        threshold=0.95,
        exact_limit=exact_limit,
        colours=ColourCheck(np.stack([BLUE, shares({99: 1.0})]), 0.8),
    )
    assert placed.joins.tolist() == ["blue", ""]
    assert placed.group.tolist() == [-1, 0] and placed.is_representative.tolist() == [False, True]


def test_colours_stay_with_their_frames_as_the_index_grows_and_merges(tmp_path):
    folder = tmp_path / "index"
    index = build(folder, alike(1, seed=0), ["f0-0"], RED[None], exact_limit=30)
    for batch in range(1, MAX_SEGMENTS + 2):
        vectors = np.concatenate([alike(1, seed=batch), alike(4, seed=100 + batch)])
        colours = np.concatenate([[RED if batch % 2 else BLUE], np.tile(BLUE, (4, 1))])
        staged = IndexWriter(folder, staging_path(folder)).add(
            index, vectors, [f"f{batch}-{i}" for i in range(5)], exact_limit=30, colours=colours
        )
        publish(staged, folder)
        index = KeptIndex.open(folder, "v1")
    assert index.manifest["centroids"]  # outgrew the exact search: rebuilt with lists
    frame_colours = dict(zip(index.frame_ids(), index.colours(), strict=True))
    assert len(frame_colours) == index.size == 1 + 5 * (MAX_SEGMENTS + 1)
    for frame, histogram in frame_colours.items():
        batch, position = (int(part) for part in frame[1:].split("-"))
        red = position == 0 and (batch == 0 or batch % 2)
        np.testing.assert_array_equal(histogram, RED if red else BLUE)


def test_an_index_built_without_colours_cannot_answer_a_colour_check(tmp_path):
    index = build(tmp_path / "index", alike(3), ["a", "b", "c"], None, exact_limit=100)
    assert index.colours() is None
    with pytest.raises(ValueError, match="force-dedup"):
        index.search(alike(1), 0.9, exact_limit=100, colours=ColourCheck(RED[None], 0.8))
