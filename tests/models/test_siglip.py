"""SigLIP scoring and image embeddings on tiny random-weight models of the real architectures.

The models are built offline with `models.tiny`, saved with save_pretrained and loaded by
directory, through the same code path as hub weights. No test reaches the network.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import pytest

from dataminer_dagster.models.image_embedder import ImageEmbedder
from dataminer_dagster.models.loading import (
    ModelUnavailableError,
    load_pretrained,
    resolve_device,
    resolve_model,
)
from dataminer_dagster.models.siglip import SiglipScorer
from dataminer_dagster.models.tiny import build_tiny_dinov2, build_tiny_siglip

PROMPTS = ["a photo of a glass door", "a person on the street", "a blurry dark image"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> Path:
    return build_tiny_siglip(tmp_path_factory.mktemp("models") / "tiny-siglip")


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> list[Path]:
    """Seven files: good jpg/png/webp frames of different sizes, a truncated jpg, a text file
    named .jpg and a path that does not exist (positions 2, 4 and 5)."""
    folder = tmp_path_factory.mktemp("frames")
    rng = np.random.default_rng(7)
    paths = []
    for i, ext in enumerate(["jpg", "png", "webp", "jpg"]):
        image = rng.integers(0, 256, (36 + 4 * i, 64 - 4 * i, 3), dtype=np.uint8)
        path = folder / f"vid_{i:06d}.{ext}"
        assert cv2.imwrite(str(path), image)
        paths.append(path)
    truncated = folder / "vid_truncated.jpg"
    truncated.write_bytes(paths[0].read_bytes()[:300])
    not_an_image = folder / "vid_text.jpg"
    not_an_image.write_text("this is not a jpeg")
    return paths[:2] + [truncated] + paths[2:3] + [not_an_image, folder / "missing.jpg"] + paths[3:]


GOOD = [0, 1, 3, 6]


def test_text_embeddings(siglip_dir):
    scorer = SiglipScorer(siglip_dir, device="cpu")
    text = scorer.embed_texts(PROMPTS)
    assert text.shape == (3, scorer.embedding_dim) and text.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(text, axis=1), 1.0, rtol=1e-5)
    # prompts are lower-cased, as in the reference
    upper = scorer.embed_texts(["A PHOTO of a Glass Door"])[0]
    np.testing.assert_allclose(upper, text[0], atol=1e-6)
    assert scorer.embed_texts([]).shape == (0, scorer.embedding_dim)
    with pytest.raises(TypeError):
        scorer.embed_texts("a single string")


def test_bad_frames_are_reported_and_the_rest_scored(siglip_dir, frames):
    scorer = SiglipScorer(siglip_dir, device="cpu", batch_size=3)
    batches = list(scorer.embed_images(frames))
    assert [b.indices.tolist() for b in batches] == [[0, 1], [3], [6]]
    errors = {index: message for b in batches for index, message in b.errors.items()}
    assert sorted(errors) == [2, 4, 5]
    assert "vid_truncated.jpg could not be read" in errors[2]
    assert "vid_text.jpg could not be read" in errors[4]
    assert "missing.jpg could not be read: file not found" in errors[5]
    # the middle batch held two bad files and one good one
    assert sorted(batches[1].errors) == [4, 5]

    result = scorer.embed_all(frames)
    assert result.indices.tolist() == GOOD
    assert result.embeddings.shape == (4, scorer.embedding_dim)
    np.testing.assert_allclose(np.linalg.norm(result.embeddings, axis=1), 1.0, rtol=1e-5)
    scores = scorer.score(result.embeddings, scorer.embed_texts(PROMPTS))
    assert scores.shape == (4, 3) and scores.dtype == np.float32
    assert np.all((scores >= 0) & (scores <= 1))


def test_a_batch_of_only_bad_frames(siglip_dir, frames):
    scorer = SiglipScorer(siglip_dir, device="cpu", batch_size=8)
    result = scorer.embed_all([frames[2], frames[4]])
    assert result.indices.shape == (0,)
    assert result.embeddings.shape == (0, scorer.embedding_dim)
    assert sorted(result.errors) == [0, 1]
    assert list(scorer.embed_images([])) == []


def test_prefetch_keeps_input_order(siglip_dir, frames):
    good = [frames[i] for i in GOOD] * 3  # 12 distinct-enough frames, repeated
    reference = SiglipScorer(siglip_dir, device="cpu", batch_size=12, prefetch_workers=0)
    expected = reference.embed_all(good).embeddings
    prefetched = SiglipScorer(siglip_dir, device="cpu", batch_size=1, prefetch_workers=3)
    batches = list(prefetched.embed_images(good))
    assert [b.indices.tolist() for b in batches] == [[i] for i in range(12)]
    got = np.concatenate([b.embeddings for b in batches])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # the four source images give four different embeddings
    assert len({tuple(np.round(row, 4)) for row in got}) == 4


def test_scores_match_the_model_forward_pass(siglip_dir, frames):
    import torch
    from PIL import Image

    scorer = SiglipScorer(siglip_dir, device="cpu")
    # decoded independently of the pipeline (PIL, as the reference system did)
    images = [np.asarray(Image.open(frames[i]).convert("RGB")) for i in GOOD]
    processor = scorer.loaded.processor
    tokens = processor.tokenizer(
        [p.lower() for p in PROMPTS],
        padding="max_length",
        max_length=64,
        truncation=True,
        return_tensors="pt",
    )
    pixels = processor.image_processor(images, return_tensors="pt")
    with torch.inference_mode():
        out = scorer.model(**tokens, **pixels)
    expected = torch.sigmoid(out.logits_per_image).numpy()

    got = scorer.score(
        scorer.embed_all([frames[i] for i in GOOD]).embeddings, scorer.embed_texts(PROMPTS)
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_deterministic_builds_and_runs(siglip_dir, frames, tmp_path):
    again = build_tiny_siglip(tmp_path / "tiny-siglip")
    first, second = SiglipScorer(siglip_dir, device="cpu"), SiglipScorer(again, device="cpu")
    assert first.model is not second.model
    # same weights and preprocessing -> same identity for the embedding cache
    assert first.model_slug == second.model_slug
    np.testing.assert_array_equal(first.embed_texts(PROMPTS), second.embed_texts(PROMPTS))
    np.testing.assert_array_equal(
        first.embed_all(frames).embeddings, second.embed_all(frames).embeddings
    )
    other_seed = SiglipScorer(build_tiny_siglip(tmp_path / "seed1", seed=1), device="cpu")
    assert other_seed.model_slug.split("-")[-1] != first.model_slug.split("-")[-1]


def test_model_is_loaded_once_per_process(siglip_dir):
    a = SiglipScorer(siglip_dir, device="auto", batch_size=4)
    b = SiglipScorer(str(siglip_dir), device="cpu", batch_size=8)
    assert a.model is b.model
    loaded = load_pretrained(siglip_dir, device="cpu")
    assert load_pretrained(siglip_dir, device="auto", dtype="float32") is loaded
    assert load_pretrained(siglip_dir, device="cpu", dtype="bfloat16").model is not loaded.model


def test_naflex_siglip2(tmp_path, frames):
    scorer = SiglipScorer(build_tiny_siglip(tmp_path / "naflex", naflex=True), device="cpu")
    assert type(scorer.model).__name__ == "Siglip2Model"
    result = scorer.embed_all(frames)
    assert result.indices.tolist() == GOOD and sorted(result.errors) == [2, 4, 5]
    scores = scorer.score(result.embeddings, scorer.embed_texts(PROMPTS))
    assert scores.shape == (4, 3) and np.all((scores >= 0) & (scores <= 1))


def test_dinov2_image_embedder(tmp_path, frames):
    embedder = ImageEmbedder(build_tiny_dinov2(tmp_path / "dino"), device="cpu", batch_size=2)
    assert type(embedder.model).__name__ == "Dinov2Model"
    result = embedder.embed_all(frames)
    assert result.indices.tolist() == GOOD and sorted(result.errors) == [2, 4, 5]
    assert result.embeddings.shape == (4, 32)
    np.testing.assert_allclose(np.linalg.norm(result.embeddings, axis=1), 1.0, rtol=1e-5)
    with pytest.raises(ValueError, match="not a SigLIP image-text model"):
        SiglipScorer(tmp_path / "dino", device="cpu")


def test_missing_hub_model_offline_gives_one_actionable_error():
    with pytest.raises(ModelUnavailableError) as caught:
        SiglipScorer("dataminer-tests/no-such-siglip", device="cpu")
    message = str(caught.value)
    assert "Model dataminer-tests/no-such-siglip is not available on this machine" in message
    assert "HF_HUB_OFFLINE" in message
    assert "hf download dataminer-tests/no-such-siglip" in message
    assert "HF_HOME" in message and "local directory" in message


def test_hub_id_is_served_from_the_local_hub_cache(siglip_dir, tmp_path, monkeypatch):
    """Weights downloaded elsewhere and copied over (HF_HOME) load offline by their hub id."""
    import shutil

    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--dataminer-tests--tiny-siglip"
    shutil.copytree(siglip_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    source = resolve_model("dataminer-tests/tiny-siglip")
    assert source.revision == commit
    assert source.slug.startswith("dataminer-tests--tiny-siglip-")
    # same files as the directory -> same identity, so both share cached embeddings
    assert source.slug.rsplit("-", 1)[1] == resolve_model(siglip_dir).slug.rsplit("-", 1)[1]
    scorer = SiglipScorer("dataminer-tests/tiny-siglip", device="cpu")
    assert scorer.embed_texts(PROMPTS).shape == (3, scorer.embedding_dim)


def test_missing_local_directory(tmp_path):
    with pytest.raises(ModelUnavailableError, match="does not exist"):
        resolve_model(str(tmp_path / "not-there") + "/")
    with pytest.raises(ValueError, match="neither an existing directory nor a hub id"):
        resolve_model("not a model id")


@pytest.mark.parametrize(
    ("device", "message"),
    [("tpu", "not one of"), ("cuda:99", "CUDA device"), ("cuda:x", "not one of")],
)
def test_device_errors(device, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(device)


def test_auto_device():
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device("CPU").type == "cpu"


TINY_IMAGE_MODELS = {
    "siglip": (SiglipScorer, build_tiny_siglip),
    "siglip2-naflex": (SiglipScorer, partial(build_tiny_siglip, naflex=True)),
    "dinov2": (ImageEmbedder, build_tiny_dinov2),
}


@pytest.mark.parametrize("name", TINY_IMAGE_MODELS)
def test_the_batch_is_sized_from_the_devices_free_memory(name, tmp_path):
    """The CUDA code path with a CPU stand-in for the memory figures: the batch is what fits in
    half the free memory, measured once with a real batch of the model's inputs (naflex: with
    its patch mask and shapes), capped by the limit."""
    from dataminer_dagster.models.image_embedder import AUTO_BATCH_LIMIT, DEFAULT_BATCH_SIZE
    from tests.models.cuda_stand_ins import StandInMemory

    embedder_class, build = TINY_IMAGE_MODELS[name]
    model_dir = build(tmp_path / name)

    def embedder(**options) -> ImageEmbedder:
        return embedder_class(model_dir, device="cpu", **options)

    plenty = StandInMemory(free=10**12, per_item=1000)
    assert embedder(memory=plenty).batch_size == AUTO_BATCH_LIMIT
    assert plenty.measured == [1]
    tight = StandInMemory(free=10_000, per_item=1000)  # half of it holds 5 images
    assert embedder(memory=tight).batch_size == 5
    capped = StandInMemory(free=10**12, per_item=1000)
    assert embedder(batch_size=7, memory=capped).batch_size == 7
    assert embedder().batch_size == DEFAULT_BATCH_SIZE  # no memory figures: as configured

    # The sized embedder embeds like the configured one.
    pictures = []
    for i in range(6):
        path = tmp_path / f"f{i}.jpg"
        cv2.imwrite(str(path), np.full((40, 60, 3), 40 * i, np.uint8))
        pictures.append(path)
    sized = embedder(memory=tight).embed_all(pictures)
    plain = embedder(batch_size=2).embed_all(pictures)
    np.testing.assert_allclose(sized.embeddings, plain.embeddings, atol=1e-5)


def test_the_same_prefetch_threads_serve_every_call(siglip_dir, frames):
    # Each prefetch thread prepares on its own CUDA stream: threads kept for the embedder's life
    # keep its cached device memory on as many streams, however many calls it serves.
    scorer = SiglipScorer(siglip_dir, device="cpu", batch_size=1, prefetch_workers=1)
    prepared_on = []
    prepare = scorer._prepare

    def recording(paths, chunk):
        prepared_on.append(threading.current_thread())
        return prepare(paths, chunk)

    scorer._prepare = recording
    for _ in range(2):
        scorer.embed_all([frames[i] for i in GOOD[:2]])
    assert len(prepared_on) == 4 and len(set(prepared_on)) == 1
    assert prepared_on[0] is not threading.current_thread()
