"""The GPU input path of image embedding (JPEG decoding and preprocessing on the model's device),
run on the CPU: the same code, with torchvision decoding on the CPU instead of nvjpeg.

On CUDA the path differs only in the decoder's backend and the stream the work runs on, so these
tests cover its choices (path, workers, dtype), its preprocessing against the PIL processor and
its per-image fallback to the CPU path.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from dataminer_dagster.core.images import read_image
from dataminer_dagster.models.device_preprocessing import (
    DevicePreprocessing,
    decode_jpegs,
    device_input_path,
    jpeg_bytes,
)
from dataminer_dagster.models.image_embedder import ImageEmbedder, default_prefetch_workers
from dataminer_dagster.models.loading import resolve_dtype
from dataminer_dagster.models.siglip import SiglipScorer
from dataminer_dagster.models.tiny import build_tiny_dinov2, build_tiny_siglip

# One uint8 level after rescaling by 1/255 and normalising with std 0.5.
LEVEL = 2 / 255


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> Path:
    return build_tiny_siglip(tmp_path_factory.mktemp("models") / "tiny-siglip")


def scene(height: int, width: int, *, grey: bool = False, seed: int = 0) -> np.ndarray:
    """A smooth random scene with noise, as video frames look (BGR, or one channel if grey)."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (9, 16, 1 if grey else 3), dtype=np.uint8)
    image = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.int16)
    image = image.reshape(height, width, -1) + rng.normal(0, 8, (height, width, 1)).astype(np.int16)
    image = image.clip(0, 255).astype(np.uint8)
    return image[..., 0] if grey else image


@pytest.fixture(scope="module")
def frames(tmp_path_factory) -> list[Path]:
    """JPEGs of odd sizes (one grey, one with EXIF data), a PNG, a JPEG with a valid header and a
    corrupt body (position 3), a truncated JPEG (5) and a missing file (6)."""
    folder = tmp_path_factory.mktemp("frames")
    paths = []
    for i, (height, width, grey) in enumerate([(36, 64, False), (41, 29, True), (50, 39, False)]):
        path = folder / f"f{i}.jpg"
        assert cv2.imwrite(str(path), scene(height, width, grey=grey, seed=i))
        paths.append(path)
    corrupt = folder / "corrupt.jpg"
    data = paths[0].read_bytes()
    corrupt.write_bytes(data[:20] + bytes(len(data) - 20))
    png = folder / "f3.png"
    assert cv2.imwrite(str(png), scene(33, 47, seed=3))
    truncated = folder / "truncated.jpg"
    truncated.write_bytes(data[: len(data) // 2])
    exif = folder / "exif.jpg"
    # an APP1 Exif segment (no tags) after the SOI marker
    exif.write_bytes(data[:2] + b"\xff\xe1\x00\x08Exif\x00\x00" + data[2:])
    return paths + [corrupt, png, truncated, folder / "missing.jpg", exif]


GOOD = [0, 1, 2, 4, 7]


def pil_processor(resample: int):
    from transformers import SiglipImageProcessorPil

    return SiglipImageProcessorPil(
        size={"height": 384, "width": 384},
        resample=resample,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )


@pytest.mark.parametrize("resample", [2, 3], ids=["bilinear", "bicubic"])
@pytest.mark.parametrize(
    ("height", "width", "grey"),
    [(360, 640, False), (37, 53, False), (401, 299, True), (500, 390, False), (384, 384, False)],
)
def test_device_preprocessing_matches_the_pil_processor(tmp_path, resample, height, width, grey):
    from torchvision.io import ImageReadMode, decode_jpeg

    path = tmp_path / "frame.jpg"
    assert cv2.imwrite(str(path), scene(height, width, grey=grey), [cv2.IMWRITE_JPEG_QUALITY, 90])
    processor = pil_processor(resample)
    expected = processor([read_image(path)], return_tensors="pt")["pixel_values"]

    decoded = decode_jpeg(jpeg_bytes(path), mode=ImageReadMode.RGB)
    # libjpeg-turbo in torchvision and in OpenCV: the same pixels
    np.testing.assert_array_equal(decoded.permute(1, 2, 0).numpy(), read_image(path))
    got = DevicePreprocessing.of(processor)([decoded], torch.float32)

    assert got.shape == expected.shape == (1, 3, 384, 384) and got.dtype == torch.float32
    difference = (got - expected).abs()
    # Pillow's fixed-point weights: at most one level, at a few percent of the pixels
    assert difference.max().item() <= LEVEL + 1e-5
    assert (difference > 1e-5).float().mean().item() < 0.05


def test_device_preprocessing_batches_mixed_sizes_in_order():
    processor = pil_processor(2)
    images = [scene(36, 64, seed=1), scene(36, 64, seed=2), scene(50, 39, seed=3)]
    rgb = [cv2.cvtColor(image, cv2.COLOR_BGR2RGB) for image in images]
    tensors = [torch.from_numpy(image).permute(2, 0, 1) for image in rgb]
    got = DevicePreprocessing.of(processor)(tensors, torch.bfloat16)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 3, 384, 384)
    expected = processor(rgb, return_tensors="pt")["pixel_values"]
    # bfloat16 keeps 8 bits: about 0.004 at values near 1
    np.testing.assert_allclose(got.float().numpy(), expected.numpy(), atol=LEVEL + 0.008)


def test_other_processors_keep_the_cpu_path(siglip_dir, tmp_path):
    from transformers import SiglipImageProcessorPil

    assert DevicePreprocessing.of(pil_processor(2)).mode == "bilinear"
    assert DevicePreprocessing.of(pil_processor(3)).mode == "bicubic"
    nearest = pil_processor(0)
    assert DevicePreprocessing.of(nearest) is None
    assert DevicePreprocessing.of(SiglipImageProcessorPil(size={"shortest_edge": 384})) is None
    naflex = SiglipScorer(build_tiny_siglip(tmp_path / "naflex", naflex=True), device="cpu")
    assert DevicePreprocessing.of(naflex.image_processor) is None
    dino = ImageEmbedder(build_tiny_dinov2(tmp_path / "dino"), device="cpu")
    assert DevicePreprocessing.of(dino.image_processor) is None


@pytest.mark.parametrize(
    ("device_type", "cpus", "decodes_on_device", "workers"),
    [
        ("cpu", 16, False, 2),
        ("cpu", 16, True, 2),
        ("cuda", 16, True, 2),  # the GPU decodes: threads only read files
        ("cuda", 16, False, 8),  # naflex or DINO on a GPU: the CPU path needs the cores
        ("cuda", 64, False, 8),
        ("cuda", 6, False, 3),
        ("cuda", 2, False, 2),
        ("cuda", None, False, 2),
    ],
)
def test_default_prefetch_workers(device_type, cpus, decodes_on_device, workers):
    assert default_prefetch_workers(device_type, cpus, decodes_on_device=decodes_on_device) == (
        workers
    )


def test_path_workers_and_dtype_for_a_device(siglip_dir, tmp_path):
    on_cpu = SiglipScorer(siglip_dir, device="cpu")
    assert on_cpu.device_preprocessing is None and on_cpu.prefetch_workers == 2
    forced = SiglipScorer(siglip_dir, device="cpu", decode_on_device=True, prefetch_workers=5)
    assert forced.device_preprocessing is not None and forced.prefetch_workers == 5
    assert (
        SiglipScorer(siglip_dir, device="cpu", decode_on_device=False).device_preprocessing is None
    )
    # the model's dtype: half precision on a GPU with tensor cores unless asked otherwise
    assert resolve_dtype(None, torch.device("cuda"), capability=(9, 0)) == torch.float16
    assert resolve_dtype("bfloat16", torch.device("cuda"), capability=(8, 0)) == torch.bfloat16
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    naflex_dir = build_tiny_siglip(tmp_path / "naflex", naflex=True)
    with pytest.raises(ValueError, match="decode_on_device=True needs a fixed-size SigLIP"):
        SiglipScorer(naflex_dir, device="cpu", decode_on_device=True)
    with pytest.raises(ValueError, match="prefetch_workers must not be negative"):
        SiglipScorer(siglip_dir, device="cpu", prefetch_workers=-1)


@pytest.mark.parametrize("workers", [0, 2])
def test_device_path_reports_and_embeds_as_the_cpu_path(siglip_dir, frames, workers):
    host = SiglipScorer(siglip_dir, device="cpu", batch_size=4, prefetch_workers=workers)
    device = SiglipScorer(
        siglip_dir, device="cpu", batch_size=4, prefetch_workers=workers, decode_on_device=True
    )
    expected, got = list(host.embed_images(frames)), list(device.embed_images(frames))
    assert [b.indices.tolist() for b in got] == [b.indices.tolist() for b in expected]
    assert [b.errors for b in got] == [b.errors for b in expected]  # the same messages
    errors = {index: message for b in got for index, message in b.errors.items()}
    assert sorted(errors) == [3, 5, 6]
    assert "corrupt.jpg could not be read" in errors[3]
    assert "missing.jpg could not be read: file not found" in errors[6]
    result = device.embed_all(frames)
    assert result.indices.tolist() == GOOD
    np.testing.assert_allclose(result.embeddings, host.embed_all(frames).embeddings, atol=2e-3)


def test_prepared_batch_is_in_the_model_dtype_and_input_order(siglip_dir, frames):
    scorer = SiglipScorer(siglip_dir, device="cpu", dtype="bfloat16", decode_on_device=True)
    # a PNG (CPU path) between JPEGs decoded on the device, a corrupt JPEG after them
    prepared = scorer._prepare(frames, [0, 4, 1, 3, 2])
    assert prepared.indices == [0, 1, 2, 4]
    assert sorted(prepared.errors) == [3]
    pixels = prepared.inputs["pixel_values"]
    assert pixels.dtype == torch.bfloat16 and pixels.shape == (4, 3, 32, 32)
    one_by_one = [scorer._prepare(frames, [i]).inputs["pixel_values"][0] for i in (0, 1, 2, 4)]
    torch.testing.assert_close(pixels, torch.stack(one_by_one), rtol=0, atol=0)


def test_a_corrupt_jpeg_leaves_the_rest_of_the_batch_decoded(frames):
    encoded = {i: jpeg_bytes(frames[i]) for i in (0, 3, 1)}
    decoded = decode_jpegs(encoded, torch.device("cpu"))
    assert list(decoded) == [0, 1]
    assert decoded[1].shape == (3, 41, 29)  # the grey JPEG, as RGB


def test_only_plain_jpegs_are_decoded_on_the_device(frames):
    assert jpeg_bytes(frames[0]) is not None and jpeg_bytes(frames[3]) is not None
    assert jpeg_bytes(frames[4]) is None  # PNG
    assert jpeg_bytes(frames[6]) is None  # missing
    assert jpeg_bytes(frames[7]) is None  # EXIF orientation: OpenCV applies it, nvjpeg not


CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    ("decode_on_device", "device", "jpeg_on_device", "on_device"),
    [
        (None, CUDA, True, True),  # a GPU with nvjpeg: decode there
        (None, CUDA, False, False),  # torchvision without nvjpeg: the CPU path
        (None, torch.device("cpu"), True, False),  # the CPU: PIL processor, as the reference
        (False, CUDA, True, False),
        (True, torch.device("cpu"), True, True),  # torchvision's libjpeg, as these tests use
    ],
)
def test_where_a_batch_is_decoded(decode_on_device, device, jpeg_on_device, on_device):
    chosen = device_input_path(
        pil_processor(2), decode_on_device, device=device, jpeg_on_device=jpeg_on_device, model="m"
    )
    assert (chosen is not None) == on_device
    # a processor without a device equivalent (naflex, DINO) always stays on the CPU
    naflex_like = pil_processor(0)
    assert (
        device_input_path(
            naflex_like, None, device=device, jpeg_on_device=jpeg_on_device, model="m"
        )
        is None
    )


def test_decoding_on_the_device_when_it_cannot_be_done_says_why():
    with pytest.raises(ValueError, match="cannot decode JPEGs on cuda .*no nvjpeg"):
        device_input_path(pil_processor(2), True, device=CUDA, jpeg_on_device=False, model="m")
    with pytest.raises(ValueError, match="needs a fixed-size SigLIP image processor; model m"):
        device_input_path(pil_processor(0), True, device=CUDA, jpeg_on_device=True, model="m")
