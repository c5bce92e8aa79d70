"""Previews and readable values, as engine/previews.py hands them to the Dagster UI."""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import cv2
import dagster as dg
import numpy as np
import pytest

from dataminer_dagster.core.files import publish, staging_path
from dataminer_dagster.core.visualize import contact_sheet, histogram
from dataminer_dagster.engine.previews import (
    DESCRIPTION_HEIGHT,
    DESCRIPTION_WIDTH,
    INLINE_MARKDOWN_LIMIT,
    inline_thumbnail,
    jpeg_within,
    megabytes,
    preview_metadata,
    previews,
    readable,
    ui_metadata,
)

IMAGE = re.compile(r"!\[([^\]]*)\]\(data:image/(jpeg|png);base64,([A-Za-z0-9+/=]+)\)")


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A picture that compresses badly: the hard case for every budget."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def decoded(markdown: str) -> list[tuple[str, np.ndarray]]:
    images = []
    for _, kind, data in IMAGE.findall(markdown):
        picture = cv2.imdecode(np.frombuffer(base64.b64decode(data), np.uint8), cv2.IMREAD_COLOR)
        assert picture is not None
        images.append((kind, picture))
    return images


@pytest.mark.parametrize("size", [(40, 60), (480, 640), (2000, 3000)])
def test_a_thumbnail_always_fits_dagsters_inline_limit(size):
    markdown = inline_thumbnail("kept_frames", noise(*size))
    assert markdown is not None and len(markdown) < INLINE_MARKDOWN_LIMIT
    ((kind, picture),) = decoded(markdown)
    assert kind == "jpeg" and picture.shape[1] >= 32


def test_a_chart_gets_a_larger_thumbnail_than_a_photo_of_the_same_size():
    chart = histogram(np.linspace(0, 1, 200), thresholds={"positive threshold": 0.3})
    as_chart = decoded(inline_thumbnail("scores", chart, chart=True))[0][1]
    as_photo = decoded(inline_thumbnail("scores", chart))[0][1]
    assert as_chart.shape[1] > as_photo.shape[1]


@pytest.mark.parametrize("budget", [2_000, 20_000, 200_000])
def test_a_picture_fits_its_budget_by_quality_then_by_size(budget):
    data = jpeg_within(noise(300, 900), budget)
    assert len(data) <= budget
    picture = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert picture is not None and picture.shape[1] > 16


def test_a_tight_budget_makes_a_smaller_picture_not_none():
    small, large = jpeg_within(noise(300, 900), 3_000), jpeg_within(noise(300, 900), 300_000)
    widths = [cv2.imdecode(np.frombuffer(d, np.uint8), 1).shape[1] for d in (small, large)]
    assert widths[0] < widths[1] == 900


def test_ui_metadata_puts_previews_first_and_keeps_pictures_out_of_the_description(tmp_path):
    sheet = contact_sheet([noise(90, 120, s) for s in range(12)], columns=6)
    chart = histogram([0.2, 0.4, 0.9], thresholds={"positive threshold": 0.5})
    metadata = {
        "outcome": "12 of 40 frames kept",
        "frames": 12,
        **preview_metadata("kept_frames", sheet, tmp_path, staging_path, budget=40_000),
        **preview_metadata("scores", chart, tmp_path, staging_path, chart=True),
    }
    shown, description = ui_metadata(metadata)
    for preview in previews(metadata):  # as a stage's completion publishes them
        publish(preview.staged, preview.file)

    assert list(shown) == [
        "kept_frames",
        "kept_frames_picture",
        "kept_frames_file",
        "scores",
        "scores_picture",
        "scores_file",
        "outcome",
        "frames",
    ]
    assert isinstance(shown["kept_frames"], dg.MarkdownMetadataValue)
    assert shown["kept_frames_file"] == dg.MetadataValue.path(tmp_path / "kept_frames.png")
    assert cv2.imread(str(tmp_path / "kept_frames.png")).shape[:2] == sheet.shape[:2]
    # The run log shows the description as text: the outcome, no image data.
    assert description == "12 of 40 frames kept"
    for name, budget in (("kept_frames", 40_000), ("scores", None)):
        ((kind, picture),) = decoded(shown[f"{name}_picture"].md_str)
        assert kind == "jpeg"
        assert picture.shape[0] <= DESCRIPTION_HEIGHT and picture.shape[1] <= DESCRIPTION_WIDTH
        if budget:
            assert len(shown[f"{name}_picture"].md_str) <= 4 / 3 * budget + 100


def test_without_an_outcome_there_is_no_description():
    assert ui_metadata({"frames": 3}) == ({"frames": 3}, None)


@pytest.mark.parametrize(
    "value, shown",
    [
        (0.9569450616836548, 0.957),
        (np.float32(0.25), 0.25),
        (np.int64(7), 7),
        (float("nan"), "nan"),
        (math.inf, "inf"),
        ("text", "text"),
        (Path("/data/x.parquet"), dg.MetadataValue.path("/data/x.parquet")),
    ],
)
def test_values_are_made_readable(value, shown):
    assert readable(value) == shown


def test_sizes_are_megabytes():
    assert megabytes(1_718_177) == 1.72
    assert megabytes(None) is None
