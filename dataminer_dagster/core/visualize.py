"""Pictures for people: detections drawn on a frame, and contact sheets for Dagster UI previews.

Images are RGB uint8 arrays, as everywhere in the pipeline; colours are RGB tuples. Drawing uses
OpenCV's Hershey fonts, which only know ASCII, so other characters in labels and captions are shown
as '?'. Nothing here reads or writes state except `write_png`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.core.files import write_atomically

FONT = 0  # cv2.FONT_HERSHEY_SIMPLEX, spelled out so importing this module does not load cv2
# Distinct, saturated colours (RGB); a label always gets the same one.
PALETTE = [
    (0, 255, 0),
    (255, 56, 56),
    (56, 139, 255),
    (255, 178, 29),
    (207, 56, 255),
    (0, 212, 187),
    (255, 112, 31),
    (146, 204, 23),
    (255, 55, 199),
    (72, 249, 10),
]
BACKGROUND = (32, 32, 32)
CAPTION_TEXT = (235, 235, 235)


def label_colour(label: str) -> tuple[int, int, int]:
    """A stable colour for `label` (the same in every run and process)."""
    return PALETTE[zlib.crc32(label.encode("utf-8")) % len(PALETTE)]


def draw_detections(
    image: np.ndarray,
    detections: Iterable[Detection],
    *,
    thickness: int = 2,
    font_scale: float = 0.5,
) -> np.ndarray:
    """Return a copy of `image` with each detection's box and a "label: score" tag drawn on it."""
    import cv2

    canvas = as_rgb(image).copy()
    height, width = canvas.shape[:2]
    for det in detections:
        colour = label_colour(det.label)
        x0, y0 = _clamp(det.x, width), _clamp(det.y, height)
        x1, y1 = _clamp(det.x + det.w, width), _clamp(det.y + det.h, height)
        cv2.rectangle(canvas, (x0, y0), (x1, y1), colour, thickness)
        text = _ascii(f"{det.label}: {det.score:.2f}")
        (tw, th), baseline = cv2.getTextSize(text, FONT, font_scale, 1)
        # The tag sits on top of the box, or just inside it when the box touches the top edge.
        top = y0 - th - baseline - 2 if y0 - th - baseline - 2 >= 0 else y0
        cv2.rectangle(canvas, (x0, top), (x0 + tw + 2, top + th + baseline + 2), colour, -1)
        cv2.putText(
            canvas,
            text,
            (x0 + 1, top + th + 1),
            FONT,
            font_scale,
            _text_colour(colour),
            1,
            cv2.LINE_AA,
        )
    return canvas


def contact_sheet(
    images: Sequence[np.ndarray | None],
    captions: Sequence[str] | None = None,
    *,
    columns: int = 4,
    tile_width: int = 240,
    tile_height: int = 180,
    font_scale: float = 0.4,
    borders: Sequence[tuple[int, int, int] | None] | None = None,
    empty: str = "(no images)",
) -> np.ndarray:
    """Tile `images` into one RGB picture, each scaled to fit its tile with its caption below.

    A None image leaves its tile empty (to start a new row, e.g. one row per duplicate group);
    `borders` frames a tile in a colour (e.g. the kept frame of a group). An empty list gives a
    single tile that says `empty`, so that a preview can always be shown.
    """
    import cv2

    if captions is not None and len(captions) != len(images):
        raise ValueError(f"contact_sheet got {len(images)} images but {len(captions)} captions")
    if borders is not None and len(borders) != len(images):
        raise ValueError(f"contact_sheet got {len(images)} images but {len(borders)} borders")
    if columns < 1 or tile_width < 8 or tile_height < 8:
        raise ValueError("contact_sheet needs columns >= 1 and tiles of at least 8x8 pixels")
    if not images:
        images = [np.full((tile_height, tile_width, 3), BACKGROUND, np.uint8)]
        captions, borders = [empty], None
    captions = list(captions) if captions is not None else [""] * len(images)
    borders = list(borders) if borders is not None else [None] * len(images)

    (_, text_height), baseline = cv2.getTextSize("Ag", FONT, font_scale, 1)
    strip = text_height + baseline + 6 if any(captions) else 0
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    sheet = np.empty((rows * (tile_height + strip), columns * tile_width, 3), np.uint8)
    sheet[:] = BACKGROUND
    for index, (image, caption, border) in enumerate(zip(images, captions, borders, strict=True)):
        top = (index // columns) * (tile_height + strip)
        left = (index % columns) * tile_width
        if image is not None:
            tile = _fit(as_rgb(image), tile_width - 2, tile_height - 2)
            th, tw = tile.shape[:2]
            y, x = top + 1 + (tile_height - 2 - th) // 2, left + 1 + (tile_width - 2 - tw) // 2
            sheet[y : y + th, x : x + tw] = tile
            if border is not None:
                # 3 pixels wide, inside the picture's own box
                cv2.rectangle(sheet, (x + 1, y + 1), (x + tw - 2, y + th - 2), border, 3)
        if caption:
            text = _fit_text(_ascii(caption), tile_width - 6, font_scale)
            cv2.putText(
                sheet,
                text,
                (left + 3, top + tile_height + text_height + 2),
                FONT,
                font_scale,
                CAPTION_TEXT,
                1,
                cv2.LINE_AA,
            )
    return sheet


def encode_jpeg(image: np.ndarray, quality: int = 85) -> bytes:
    """JPEG bytes of an RGB image (Huffman tables optimised: fewer bytes at the same quality)."""
    import cv2

    ok, buffer = cv2.imencode(
        ".jpg",
        cv2.cvtColor(as_rgb(image), cv2.COLOR_RGB2BGR),
        [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_OPTIMIZE, 1],
    )
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} image as JPEG")
    return buffer.tobytes()


def encode_palette_png(image: np.ndarray, colours: int) -> bytes:
    """PNG bytes of an RGB image reduced to `colours` colours: tiny for charts."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(as_rgb(image)).quantize(colours, method=Image.Quantize.MEDIANCUT).save(
        buffer, "PNG", optimize=True
    )
    return buffer.getvalue()


def resize_to(image: np.ndarray, max_width: int, max_height: int) -> np.ndarray:
    """`image` scaled down (never up) to fit max_width x max_height, keeping its aspect ratio."""
    height, width = image.shape[:2]
    if width <= max_width and height <= max_height:
        return image
    return _fit(as_rgb(image), max_width, max_height)


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB image (e.g. for a Dagster metadata preview)."""
    import cv2

    ok, buffer = cv2.imencode(".png", cv2.cvtColor(as_rgb(image), cv2.COLOR_RGB2BGR))
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} image as PNG")
    return buffer.tobytes()


def write_png(path: str | os.PathLike[str], image: np.ndarray) -> Path:
    """Write an RGB image as PNG atomically (temporary sibling, then rename)."""
    path = Path(path)
    return write_atomically(path, encode_png(image))


def as_rgb(image: np.ndarray) -> np.ndarray:
    """An HxWx3 uint8 view of a grey, grey+1, RGB or RGBA uint8 image."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"expected a uint8 image, got dtype {image.dtype}")
    if image.ndim == 2:
        return np.repeat(image[:, :, None], 3, axis=2)
    if image.ndim == 3 and image.shape[2] in (1, 3, 4):
        return np.ascontiguousarray(
            np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image[:, :, :3]
        )
    raise ValueError(f"expected an HxW or HxWxC image with C in 1, 3, 4; got shape {image.shape}")


def _fit(image: np.ndarray, max_width: int, max_height: int) -> np.ndarray:
    import cv2

    height, width = image.shape[:2]
    scale = min(max_width / width, max_height / height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if size == (width, height):
        return image
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interpolation)


def _fit_text(text: str, max_width: int, font_scale: float) -> str:
    import cv2

    def width(s: str) -> int:
        return cv2.getTextSize(s, FONT, font_scale, 1)[0][0]

    if width(text) <= max_width:
        return text
    while text and width(text + "...") > max_width:
        text = text[:-1]
    return text + "..."


def _ascii(text: str) -> str:
    return "".join(c if 32 <= ord(c) < 127 else "?" for c in text)


def _clamp(value: float, limit: int) -> int:
    return int(round(min(max(float(value), 0.0), float(limit - 1))))


def _text_colour(background: tuple[int, int, int]) -> tuple[int, int, int]:
    r, g, b = background
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 128 else (255, 255, 255)


THRESHOLD_COLOURS = [PALETTE[1], PALETTE[3], PALETTE[4], PALETTE[5]]
AXIS = (150, 150, 150)


def histogram(
    values: Sequence[float],
    *,
    bins: int = 40,
    value_range: tuple[float, float] = (0.0, 1.0),
    thresholds: Mapping[str, float] | None = None,
    title: str = "",
    x_label: str = "score",
    y_label: str = "frames",
    width: int = 520,
    height: int = 240,
) -> np.ndarray:
    """A bar chart of `values` (NaNs ignored) with both axes ticked and labelled, and a labelled
    vertical line per threshold (`{"positive threshold": 0.3}`)."""
    import cv2

    low, high = value_range
    if not high > low:
        raise ValueError(f"histogram needs value_range low < high, got {value_range}")
    chart = np.empty((height, width, 3), np.uint8)
    chart[:] = BACKGROUND
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data)]
    counts, _ = np.histogram(data, bins=bins, range=value_range)
    shown = [(name, float(v)) for name, v in (thresholds or {}).items() if low <= v <= high]
    top = 22 + 14 * max(1, len(shown))  # the title, then one line per threshold label
    left, right, bottom = 44, width - 12, height - 34
    tallest = max(1, int(counts.max(initial=0)))

    def x_of(value: float) -> int:
        return int(round(left + (value - low) / (high - low) * (right - left)))

    def y_of(count: float) -> int:
        return int(round(bottom - count / tallest * (bottom - top)))

    for i, count in enumerate(counts):
        x0, x1 = x_of(low + i * (high - low) / bins), x_of(low + (i + 1) * (high - low) / bins) - 1
        if count:
            cv2.rectangle(chart, (x0, y_of(count)), (max(x0, x1), bottom), PALETTE[2], -1)

    cv2.line(chart, (left, top), (left, bottom), AXIS, 1)
    cv2.line(chart, (left, bottom), (right, bottom), AXIS, 1)
    for tick in np.linspace(low, high, 5):
        x = x_of(float(tick))
        cv2.line(chart, (x, bottom), (x, bottom + 4), AXIS, 1)
        _text(chart, f"{tick:g}", (x, bottom + 16), 0.38, align="centre")
    for count in sorted({0, tallest // 2, tallest}):
        y = y_of(count)
        cv2.line(chart, (left - 4, y), (left, y), AXIS, 1)
        _text(chart, str(count), (left - 7, y + 4), 0.38, align="right")
    _text(chart, x_label, ((left + right) // 2, height - 4), 0.4, align="centre")
    _text(chart, y_label, (4, top - 6), 0.38)

    caption = f"{title} (n={len(data)})" if title else f"n={len(data)}"
    _text(chart, caption, (left, 16), 0.45)
    for index, (name, value) in enumerate(shown):
        colour = THRESHOLD_COLOURS[index % len(THRESHOLD_COLOURS)]
        x = x_of(value)
        label_y = 22 + 14 * (index + 1) - 2
        cv2.line(chart, (x, label_y + 3), (x, bottom), colour, 2)
        label = f"{name} {value:g}"
        align = "right" if x > (left + right) // 2 else "left"
        _text(chart, label, (x - 4 if align == "right" else x + 4, label_y), 0.4, colour, align)
    return chart


def _text(
    canvas: np.ndarray,
    text: str,
    origin: tuple[int, int],
    scale: float,
    colour: tuple[int, int, int] = CAPTION_TEXT,
    align: str = "left",
) -> None:
    """Draw `text` with its baseline at origin's y; origin's x is its left end, centre or right
    end (`align`)."""
    import cv2

    text = _ascii(text)
    (tw, _), _ = cv2.getTextSize(text, FONT, scale, 1)
    x = origin[0] - {"left": 0, "centre": tw // 2, "right": tw}[align]
    x = min(max(x, 0), canvas.shape[1] - tw)
    cv2.putText(canvas, text, (x, origin[1]), FONT, scale, colour, 1, cv2.LINE_AA)
