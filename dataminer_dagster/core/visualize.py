"""Pictures for people: detections drawn on a frame, and contact sheets for Dagster UI previews.

Images are RGB uint8 arrays, as everywhere in the pipeline; colours are RGB tuples. Drawing uses
OpenCV's Hershey fonts, which only know ASCII, so other characters in labels and captions are shown
as '?'. Nothing here reads or writes state except `write_png`.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from dataminer_dagster.core.coco import Box

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
    detections: Iterable[Box],
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
    images: Sequence[np.ndarray],
    captions: Sequence[str] | None = None,
    *,
    columns: int = 4,
    tile_width: int = 240,
    tile_height: int = 180,
    font_scale: float = 0.4,
) -> np.ndarray:
    """Tile `images` into one RGB picture, each scaled to fit its tile with its caption below.

    An empty list gives a single tile that says so, so that a preview can always be shown.
    """
    import cv2

    if captions is not None and len(captions) != len(images):
        raise ValueError(f"contact_sheet got {len(images)} images but {len(captions)} captions")
    if columns < 1 or tile_width < 8 or tile_height < 8:
        raise ValueError("contact_sheet needs columns >= 1 and tiles of at least 8x8 pixels")
    if not images:
        images, captions = (
            [np.full((tile_height, tile_width, 3), BACKGROUND, np.uint8)],
            ["(no images)"],
        )
    captions = list(captions) if captions is not None else [""] * len(images)

    (_, text_height), baseline = cv2.getTextSize("Ag", FONT, font_scale, 1)
    strip = text_height + baseline + 6 if any(captions) else 0
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    sheet = np.empty((rows * (tile_height + strip), columns * tile_width, 3), np.uint8)
    sheet[:] = BACKGROUND
    for index, (image, caption) in enumerate(zip(images, captions, strict=True)):
        top = (index // columns) * (tile_height + strip)
        left = (index % columns) * tile_width
        tile = _fit(as_rgb(image), tile_width - 2, tile_height - 2)
        th, tw = tile.shape[:2]
        y, x = top + 1 + (tile_height - 2 - th) // 2, left + 1 + (tile_width - 2 - tw) // 2
        sheet[y : y + th, x : x + tw] = tile
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
    data = encode_png(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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


def histogram(
    values: Sequence[float],
    *,
    bins: int = 40,
    value_range: tuple[float, float] = (0.0, 1.0),
    marker: float | None = None,
    title: str = "",
    width: int = 480,
    height: int = 200,
) -> np.ndarray:
    """A bar chart of `values` (NaNs ignored) with an optional vertical marker (a threshold)."""
    import cv2

    chart = np.empty((height, width, 3), np.uint8)
    chart[:] = BACKGROUND
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data)]
    counts, _ = np.histogram(data, bins=bins, range=value_range)
    top, bottom, left, right = 24, height - 18, 6, width - 6
    scale = (bottom - top) / max(1, counts.max(initial=0))
    bar = (right - left) / bins
    for i, count in enumerate(counts):
        x0, x1 = int(left + i * bar), int(left + (i + 1) * bar) - 1
        cv2.rectangle(chart, (x0, bottom - int(count * scale)), (x1, bottom), PALETTE[2], -1)
    if marker is not None and value_range[0] <= marker <= value_range[1]:
        x = int(
            left + (marker - value_range[0]) / (value_range[1] - value_range[0]) * (right - left)
        )
        cv2.line(chart, (x, top - 4), (x, bottom), PALETTE[1], 2)
    caption = f"{title} (n={len(data)})" if title else f"n={len(data)}"
    cv2.putText(chart, _ascii(caption), (left, 16), FONT, 0.45, CAPTION_TEXT, 1, cv2.LINE_AA)
    for value, align in ((value_range[0], 0), (value_range[1], 1)):
        text = f"{value:g}"
        (tw, _), _ = cv2.getTextSize(text, FONT, 0.4, 1)
        x = left if align == 0 else right - tw
        cv2.putText(chart, text, (x, height - 4), FONT, 0.4, CAPTION_TEXT, 1, cv2.LINE_AA)
    return chart
