"""The embedding cache: per (model, video) files of content hashes and float16 embeddings."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dataminer_dagster.core import embedding_cache
from dataminer_dagster.core.embedding_cache import EmbeddingCache, quantize


def vectors(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def hashes(*names: str) -> list[str]:
    return [f"{name:0>16}" for name in names]


def test_round_trip(tmp_path):
    cache = EmbeddingCache(tmp_path, "siglip-abc123")
    keys = hashes("a1", "b2", "c3")
    emb = vectors(3)
    cache.put("dQw4w9WgXcQ", keys, emb)

    found, got = cache.get("dQw4w9WgXcQ", keys)
    assert found.tolist() == [True, True, True]
    assert got.dtype == np.float32 and got.shape == (3, 8)
    np.testing.assert_array_equal(got, quantize(emb))
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=2e-3)
    # float16 storage, one file for the video
    assert [p.name for p in cache.directory.iterdir()] == ["dQw4w9WgXcQ.npz"]
    with np.load(cache.path_for("dQw4w9WgXcQ")) as data:
        assert data["embeddings"].dtype == np.float16


def test_partial_hits_keep_query_order(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    emb = vectors(3)
    cache.put("v", hashes("a", "b", "c"), emb)
    found, got = cache.get("v", hashes("c", "x", "a", "y", "c"))
    assert found.tolist() == [True, False, True, False, True]
    np.testing.assert_array_equal(got, quantize(emb)[[2, 0, 2]])


def test_misses(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    found, got = cache.get("never-stored", hashes("a", "b"))
    assert found.tolist() == [False, False] and got.shape[0] == 0
    cache.put("v", hashes("a"), vectors(1))
    found, got = cache.get("v", [])
    assert found.shape == (0,) and got.shape == (0, 8)


def test_update_merges_and_overwrites(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    first, second = vectors(2, seed=1), vectors(2, seed=2)
    cache.put("v", hashes("a", "b"), first)
    cache.put("v", hashes("b", "c"), second)
    found, got = cache.get("v", hashes("a", "b", "c"))
    assert found.all()
    np.testing.assert_array_equal(got, quantize(np.stack([first[0], second[0], second[1]])))


def test_duplicate_hashes_in_one_put(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    emb = vectors(3)
    cache.put("v", hashes("a", "a", "b"), emb)
    found, got = cache.get("v", hashes("a", "b"))
    assert found.all()
    np.testing.assert_array_equal(got, quantize(emb[[0, 2]]))


def test_models_and_videos_do_not_mix(tmp_path):
    siglip, dino = EmbeddingCache(tmp_path, "siglip-1"), EmbeddingCache(tmp_path, "dino-2")
    siglip.put("v", hashes("a"), vectors(1, seed=1))
    dino.put("v", hashes("a"), vectors(1, dim=4, seed=2))
    assert siglip.get("v", hashes("a"))[1].shape == (1, 8)
    assert dino.get("v", hashes("a"))[1].shape == (1, 4)
    assert not siglip.get("other-video", hashes("a"))[0].any()
    assert not EmbeddingCache(tmp_path, "siglip-3").get("v", hashes("a"))[0].any()


def test_rewrite_is_atomic(tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path, "m")
    emb = vectors(2)
    cache.put("v", hashes("a", "b"), emb)
    before = cache.path_for("v").read_bytes()

    def crash(src, dst):
        raise OSError("disk went away")

    monkeypatch.setattr(embedding_cache.os, "replace", crash)
    with pytest.raises(OSError, match="disk went away"):
        cache.put("v", hashes("c"), vectors(1, seed=3))
    monkeypatch.undo()

    assert cache.path_for("v").read_bytes() == before
    assert sorted(p.name for p in cache.directory.iterdir()) == ["v.npz"], "temp file left behind"
    found, got = cache.get("v", hashes("a", "b", "c"))
    assert found.tolist() == [True, True, False]


def test_unreadable_file_is_a_miss_and_gets_replaced(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    cache.directory.mkdir(parents=True)
    cache.path_for("v").write_bytes(b"not an npz file")
    assert not cache.get("v", hashes("a"))[0].any()
    cache.put("v", hashes("a"), vectors(1))
    assert cache.get("v", hashes("a"))[0].all()


def test_dimension_mismatch_is_refused(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    cache.put("v", hashes("a"), vectors(1, dim=8))
    with pytest.raises(ValueError, match="dimension 4 .* 8"):
        cache.put("v", hashes("b"), vectors(1, dim=4))


@pytest.mark.parametrize("bad", ["../escape", "a/b", "", ".", ".."])
def test_names_must_be_single_path_components(tmp_path, bad):
    with pytest.raises(ValueError, match="cannot name a cache file"):
        EmbeddingCache(tmp_path, bad)
    with pytest.raises(ValueError, match="cannot name a cache file"):
        EmbeddingCache(tmp_path, "m").get(bad, hashes("a"))


def test_rows_must_match_hashes(tmp_path):
    with pytest.raises(ValueError, match="one embedding row per hash"):
        EmbeddingCache(tmp_path, "m").put("v", hashes("a", "b"), vectors(3))


def test_youtube_ids_starting_with_a_dash(tmp_path):
    cache = EmbeddingCache(tmp_path, "m")
    cache.put("-abc_DEF123", hashes("a"), vectors(1))
    assert cache.get("-abc_DEF123", hashes("a"))[0].all()
    assert os.path.basename(cache.path_for("-abc_DEF123")) == "-abc_DEF123.npz"
