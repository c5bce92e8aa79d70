from dataclasses import dataclass

import cv2
import numpy as np
import pytest

from dataminer_dagster.core.visualize import (
    BACKGROUND,
    as_rgb,
    contact_sheet,
    draw_detections,
    encode_png,
    label_colour,
    write_png,
)


@dataclass(frozen=True)
class Det:
    x: float
    y: float
    w: float
    h: float
    score: float
    label: str


def frame(height=120, width=160, value=90) -> np.ndarray:
    return np.full((height, width, 3), value, np.uint8)


def test_draw_detections_draws_box_and_tag_without_touching_the_input():
    image = frame()
    det = Det(40, 50, 60, 30, 0.87, "red car")
    drawn = draw_detections(image, [det])

    assert drawn.shape == image.shape and drawn.dtype == np.uint8
    assert (image == 90).all()
    colour = label_colour("red car")
    assert tuple(drawn[65, 40]) == colour  # left edge of the box
    assert tuple(drawn[80, 70]) == colour  # bottom edge
    assert tuple(drawn[65, 70]) == (90, 90, 90)  # inside stays untouched
    assert (drawn[30:50, 40:100] != 90).any()  # the tag above the box


def test_draw_detections_handles_boxes_at_and_beyond_the_border_and_odd_labels():
    image = frame()
    dets = [
        Det(-20, -10, 50, 40, 0.5, "chat noir \u00e9t\u00e9"),
        Det(150, 110, 100, 100, 1.0, "x"),
    ]
    drawn = draw_detections(image, dets)
    assert drawn.shape == image.shape
    assert (drawn[0:15, 0:30] != 90).any()  # tag drawn inside the box at the top edge
    assert np.array_equal(draw_detections(image, []), image)


def test_label_colours_are_stable():
    assert label_colour("person") == label_colour("person")
    assert len({label_colour(name) for name in ["person", "car", "dog", "cat", "bus", "truck"]}) > 1


def test_contact_sheet_layout_and_captions():
    images = [frame(value=v) for v in (10, 60, 110, 160, 210)]
    sheet = contact_sheet(
        images, [f"frame {i}" for i in range(5)], columns=3, tile_width=100, tile_height=80
    )

    strip = (sheet.shape[0] - 2 * 80) // 2
    assert strip > 0
    assert sheet.shape == (2 * (80 + strip), 300, 3)
    # a 160x120 frame scaled into a 98x78 tile keeps its aspect ratio: 98 x 74 (rounded)
    assert tuple(sheet[40, 50]) == (10, 10, 10)
    assert tuple(sheet[80 + strip + 40, 50]) == (160, 160, 160)
    assert tuple(sheet[80 + strip + 40, 150]) == (210, 210, 210)
    assert tuple(sheet[80 + strip + 40, 250]) == BACKGROUND  # the sixth tile is empty
    caption_rows = sheet[80 : 80 + strip, 0:100]
    assert (caption_rows != BACKGROUND).any()


def test_contact_sheet_without_captions_has_no_caption_strip():
    sheet = contact_sheet([frame()] * 2, columns=4, tile_width=64, tile_height=48)
    assert sheet.shape == (48, 128, 3)


def test_contact_sheet_accepts_grey_rgba_and_extreme_shapes():
    images = [
        np.full((50, 40), 200, np.uint8),
        np.full((30, 30, 1), 100, np.uint8),
        np.zeros((20, 20, 4), np.uint8),
        np.full((10, 1000, 3), 50, np.uint8),
        np.full((1000, 3, 3), 50, np.uint8),
    ]
    sheet = contact_sheet(
        images,
        ["a caption much too long to fit under a tiny tile"] * 5,
        tile_width=64,
        tile_height=48,
    )
    assert sheet.shape[1] == 4 * 64 and sheet.dtype == np.uint8


def test_contact_sheet_of_nothing_is_a_placeholder():
    sheet = contact_sheet([], tile_width=64, tile_height=48)
    assert sheet.shape[1] == 64 and sheet.shape[0] > 48


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"images": [frame()], "captions": ["a", "b"]}, "1 images but 2 captions"),
        ({"images": [frame()], "columns": 0}, "columns >= 1"),
        ({"images": [np.zeros((4, 4, 3), np.float32)]}, "uint8"),
        ({"images": [np.zeros((4, 4, 2), np.uint8)]}, "got shape (4, 4, 2)"),
    ],
)
def test_contact_sheet_errors(kwargs, message):
    with pytest.raises(ValueError) as err:
        contact_sheet(**kwargs)
    assert message in str(err.value)


def test_png_round_trip_keeps_rgb_order(tmp_path):
    image = np.zeros((8, 8, 3), np.uint8)
    image[..., 0] = 255  # pure red in RGB
    decoded = cv2.imdecode(np.frombuffer(encode_png(image), np.uint8), cv2.IMREAD_COLOR)
    assert tuple(decoded[0, 0]) == (0, 0, 255)  # OpenCV reads BGR

    path = write_png(tmp_path / "previews" / "sheet.png", image)
    assert [p.name for p in path.parent.iterdir()] == ["sheet.png"]
    assert np.array_equal(cv2.imread(str(path))[..., ::-1], image)


def test_as_rgb_shapes():
    assert as_rgb(np.zeros((3, 4), np.uint8)).shape == (3, 4, 3)
    assert as_rgb(np.zeros((3, 4, 4), np.uint8)).shape == (3, 4, 3)
