from __future__ import annotations

import re

import numpy as np
import pytest

from dataminer_dagster.core.images import (
    ImageReadError,
    brightness_of_file,
    decode_image,
    encode_image,
    fit_within,
    image_format_of,
    list_images,
    picture_measures,
    read_image,
    write_image,
)
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames

FORMATS = ["jpg", "png", "webp"]


@pytest.fixture(scope="module")
def frame() -> np.ndarray:
    """A realistic BGR frame: shapes, text and noise."""
    return next(synthetic_frames(SyntheticVideoSpec(width=160, height=120, seconds=0.1)))


@pytest.mark.parametrize("image_format", FORMATS)
@pytest.mark.parametrize("order", ["rgb", "bgr"])
def test_written_images_read_back_in_every_format(tmp_path, frame, image_format, order):
    path = tmp_path / f"frame.{image_format}"
    data = write_image(path, frame, quality=95)

    assert path.read_bytes() == data
    image = read_image(path, order=order)
    expected = frame if order == "bgr" else frame[..., ::-1]
    assert image.shape == (120, 160, 3) and image.dtype == np.uint8
    error = np.abs(image.astype(int) - expected.astype(int)).mean()
    assert error == 0 if image_format == "png" else error < 6


@pytest.mark.parametrize("image_format", ["jpg", "webp"])
def test_quality_trades_size_for_fidelity(frame, image_format):
    small = encode_image(frame, image_format, quality=20)
    large = encode_image(frame, image_format, quality=95)

    assert len(small) < len(large)
    errors = [
        np.abs(decode_image(d, order="bgr").astype(int) - frame).mean() for d in (small, large)
    ]
    assert errors[0] > errors[1]


def test_rgb_input_is_stored_as_the_same_colours(frame):
    rgb = np.ascontiguousarray(frame[..., ::-1])

    data = encode_image(rgb, "png", order="rgb")

    assert np.array_equal(decode_image(data, order="rgb"), rgb)


@pytest.mark.parametrize(
    ("size", "max_side", "expected"),
    [
        ((160, 120), 80, (80, 60)),
        ((120, 160), 80, (60, 80)),
        ((160, 120), 500, (160, 120)),
        ((160, 120), None, (160, 120)),
        ((1920, 1080), 1280, (1280, 720)),
        ((3000, 2), 100, (100, 1)),
    ],
)
def test_fit_within_keeps_the_aspect_ratio(size, max_side, expected):
    assert fit_within(*size, max_side) == expected


def test_max_side_downscales_before_encoding(frame):
    data = encode_image(frame, "jpg", max_side=80)

    assert decode_image(data).shape == (60, 80, 3)


def test_jpeg_suffix_is_written_as_jpg(tmp_path, frame):
    write_image(tmp_path / "a.JPEG", frame)

    assert image_format_of(tmp_path / "a.JPEG") == "jpg"
    assert read_image(tmp_path / "a.JPEG").shape == (120, 160, 3)


def test_list_images_finds_every_supported_format_in_name_order(tmp_path, frame):
    for name in ["c.webp", "a.jpg", "b.png", "d.jpeg"]:
        write_image(tmp_path / name, frame)
    (tmp_path / "manifest.parquet").write_bytes(b"not an image")
    (tmp_path / "sub.jpg").mkdir()

    assert [p.name for p in list_images(tmp_path)] == ["a.jpg", "b.png", "c.webp", "d.jpeg"]


def test_sharpness_is_higher_for_a_sharper_image(frame):
    import cv2

    blurred = cv2.GaussianBlur(frame, (9, 9), 3)

    assert picture_measures(frame)[0] > 2 * picture_measures(blurred)[0] > 0


@pytest.mark.parametrize("image_format", FORMATS)
def test_brightness_is_the_mean_grey_level_in_memory_and_from_a_file(tmp_path, frame, image_format):
    """Extraction measures the picture it encodes; a frame extracted before is measured from its
    file, at an eighth of its size for a JPEG: the two agree within a level."""
    dark = (frame * 0.2).astype(np.uint8)
    for picture in (frame, dark):
        _, measured = picture_measures(picture)
        write_image(tmp_path / f"f.{image_format}", picture, quality=95)
        assert abs(brightness_of_file(tmp_path / f"f.{image_format}") - measured) < 1.5
    assert picture_measures(dark)[1] < 0.3 * picture_measures(frame)[1]
    assert picture_measures(np.full((40, 60, 3), 255, np.uint8))[1] == 255.0
    with pytest.raises(ImageReadError, match="not a readable"):
        (tmp_path / "x.jpg").write_bytes(b"nope")
        brightness_of_file(tmp_path / "x.jpg")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "file not found"),
        (b"", "file is empty (0 bytes)"),
        (b"hello, not an image", "not a readable JPEG, PNG or WebP image"),
    ],
)
def test_unreadable_images_raise_with_the_reason_and_path(tmp_path, content, reason):
    path = tmp_path / "frame.jpg"
    if content is not None:
        path.write_bytes(content)

    with pytest.raises(ImageReadError) as error:
        read_image(path)

    assert str(error.value) == f"Image frame.jpg could not be read: {reason} (file {path})"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda f: encode_image(f, "gif"),
            "Unsupported image_format 'gif'; allowed: jpg, png, webp",
        ),
        (lambda f: encode_image(f, "jpg", quality=0), "quality must be between 1 and 100, got 0"),
        (lambda f: write_image("x.bmp", f), "Unsupported image suffix '.bmp'"),
    ],
)
def test_bad_arguments_name_the_allowed_values(frame, call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call(frame)
