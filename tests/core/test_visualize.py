import cv2
import numpy as np
import pytest

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.core.visualize import (
    AXIS,
    BACKGROUND,
    PALETTE,
    THRESHOLD_COLOURS,
    as_rgb,
    contact_sheet,
    draw_detections,
    encode_jpeg,
    encode_palette_png,
    encode_png,
    histogram,
    label_colour,
    write_png,
)


def frame(height=120, width=160, value=90) -> np.ndarray:
    return np.full((height, width, 3), value, np.uint8)


def test_draw_detections_draws_box_and_tag_without_touching_the_input():
    image = frame()
    det = Detection(40, 50, 60, 30, 0.87, "red car")
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
        Detection(-20, -10, 50, 40, 0.5, "chat noir \u00e9t\u00e9"),
        Detection(150, 110, 100, 100, 1.0, "x"),
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


def test_contact_sheet_leaves_none_slots_empty_and_frames_bordered_tiles():
    images = [frame(value=200), frame(value=120), None, frame(value=60)]
    sheet = contact_sheet(
        images,
        columns=3,
        tile_width=100,
        tile_height=80,
        borders=[(0, 255, 0), None, None, None],
    )
    assert sheet.shape == (160, 300, 3)
    assert tuple(sheet[40, 250]) == BACKGROUND  # the None slot: nothing drawn
    assert tuple(sheet[120, 50]) == (60, 60, 60)  # the next image starts the second row
    top_left = sheet[0:80, 0:100]
    assert ((top_left == (0, 255, 0)).all(axis=2)).sum() > 200  # a green frame around tile 1
    assert not ((sheet[0:80, 100:200] == (0, 255, 0)).all(axis=2)).any()


def test_contact_sheet_of_nothing_says_why():
    told = contact_sheet([], tile_width=200, tile_height=60, empty="no detections")
    default = contact_sheet([], tile_width=200, tile_height=60)
    assert told.shape == default.shape and not np.array_equal(told, default)


def _columns_of(chart: np.ndarray, colour) -> set[int]:
    return set(np.nonzero((chart == colour).all(axis=2).any(axis=0))[0].tolist())


def test_histogram_has_axes_and_a_labelled_line_per_threshold():
    values = [0.1] * 5 + [0.6] * 10
    chart = histogram(
        values,
        thresholds={"positive threshold": 0.25, "junk threshold": 0.75},
        width=520,
        height=240,
    )
    assert chart.shape == (240, 520, 3)
    left, right, bottom = 44, 520 - 12, 240 - 34
    # (threshold lines cross the x axis)
    assert (chart[bottom, left:right] == AXIS).all(axis=1).mean() > 0.95, "the x axis"
    assert (chart[80:bottom, left] == AXIS).all(), "the y axis"
    for name, value, colour in [
        ("positive", 0.25, THRESHOLD_COLOURS[0]),
        ("junk", 0.75, THRESHOLD_COLOURS[1]),
    ]:
        x = round(left + value * (right - left))
        columns = _columns_of(chart[100:bottom], colour)
        assert {x - 1, x, x + 1} & columns, f"the {name} threshold line at x={x}"
        label_rows = chart[20:60]  # its label, in its colour, above the bars
        assert (label_rows == colour).all(axis=2).sum() > 20, f"the {name} threshold's label"
    bars = _columns_of(chart[50:bottom], PALETTE[2])
    assert min(bars) < left + 0.15 * (right - left) < max(bars), "bars where the values are"


def test_histogram_of_nothing_is_an_empty_chart_not_an_error():
    chart = histogram([], thresholds={"threshold": 0.5})
    assert not _columns_of(chart, PALETTE[2])
    with pytest.raises(ValueError, match="low < high"):
        histogram([0.5], value_range=(1.0, 1.0))


def test_jpeg_and_palette_png_keep_rgb_order():
    image = np.zeros((16, 16, 3), np.uint8)
    image[..., 0] = 255  # pure red in RGB
    for data in (encode_jpeg(image, 90), encode_palette_png(image, 4)):
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        b, g, r = (int(c) for c in decoded[8, 8])
        assert r > 240 and g < 16 and b < 16


def test_a_contact_sheet_of_nothing_with_borders_is_the_empty_tile():
    """The dedup preview passes its (empty) borders along: a project where no frame passed."""
    sheet = contact_sheet([], captions=[], borders=[], tile_width=100, tile_height=80)
    assert sheet.shape[1] == 100 and (sheet == BACKGROUND).all(axis=2).mean() > 0.9
