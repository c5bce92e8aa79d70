"""What the Dagster UI shows of a stage's result: previews (pictures) and readable metadata values.

Where Dagster 1.13 shows pictures (checked in its UI source, ui-core):
* a Markdown metadata value is drawn in place on the Overview, Partitions and Events tabs only when
  it is shorter than 1000 characters (`MetadataEntry.tsx`: `expandSmallValues && mdStr.length <
  1000`); a longer one opens behind [Show Markdown];
* a materialization's description is its message in the run log, as text: so it holds no picture.

So a preview is three metadata values: a thumbnail that fits the 1000 characters (drawn in place),
the picture (at most `DESCRIPTION_WIDTH` x `DESCRIPTION_HEIGHT`, a JPEG within a size budget)
behind [Show Markdown] as `<name>_picture`, and the full-size PNG on disk (`<name>_file`). A
picture that does not fit its budget is made smaller, never left out. The description is the
item's outcome in words ("12 of 40 frames kept"), what the run log then shows for the event.

A stage puts `Preview`s and plain values in its `ItemResult.metadata`; `ui_metadata` (called by the
stage machinery for every event) turns them into what the UI receives: typed values, floats
rounded to 3 places, previews split into thumbnail, picture and file.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np

from dataminer_dagster.core.visualize import encode_jpeg, encode_palette_png, resize_to, write_png

INLINE_MARKDOWN_LIMIT = 1000  # characters; Dagster shows shorter Markdown values in place
PREVIEW_BUDGET = 120_000  # bytes of JPEG per picture in a project's event
VIDEO_PREVIEW_BUDGET = 30_000  # per picture in a per-video event (there are many of those)
DESCRIPTION_HEIGHT = 290  # pixels of a picture: what a [Show Markdown] dialog shows unscrolled
DESCRIPTION_WIDTH = 940  # pixels; the dialog's width at a 1600-pixel-wide window
DECIMALS = 3  # every float the UI shows is rounded to this many places

_THUMBNAIL_WIDTHS = (200, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32)
_THUMBNAIL_QUALITIES = (50, 35, 25)


@dataclass(frozen=True)
class Preview:
    """A picture for the UI: the full-size PNG `file`, the thumbnail's Markdown image, and the
    picture (at most DESCRIPTION_WIDTH x DESCRIPTION_HEIGHT) shown behind [Show Markdown] within
    `budget` bytes. The PNG is written to `staged` and published to `file` in the item's
    completion (engine/stage_run.py), as the stage's other outputs are: a run that lost its lease
    replaces no picture."""

    name: str
    file: Path
    staged: Path
    thumbnail_markdown: str | None  # None only when not even a 32-pixel thumbnail fits
    picture: np.ndarray
    budget: int

    def picture_markdown(self) -> str:
        return _markdown_image(self.name, jpeg_within(self.picture, self.budget), "jpeg")


def preview_metadata(
    name: str,
    picture: np.ndarray,
    directory: Path,
    staging_path: Callable[[Path], Path],
    *,
    budget: int = PREVIEW_BUDGET,
    cover: np.ndarray | None = None,
    chart: bool = False,
) -> dict[str, Preview]:
    """`{name: Preview}`, ready to merge into an ItemResult's metadata: `picture` (RGB) written for
    `<directory>/<name>.png` (to `staging_path` of it, the stage's `ctx.staging_path`; the item's
    completion publishes it) and fitted to the UI's limits. The thumbnail is made from `cover`
    when given (e.g. the best frame rather than a whole sheet shrunk to a few pixels per tile); a
    `chart` (flat colours) may get a few-colour PNG one."""
    final = directory / f"{name}.png"
    preview = Preview(
        name=name,
        file=final,
        staged=write_png(staging_path(final), picture),
        thumbnail_markdown=inline_thumbnail(name, picture if cover is None else cover, chart=chart),
        picture=resize_to(picture, DESCRIPTION_WIDTH, DESCRIPTION_HEIGHT),
        budget=budget,
    )
    return {name: preview}


def jpeg_within(picture: np.ndarray, budget: int) -> bytes:
    """The best JPEG of `picture` within `budget` bytes: lower quality first, then smaller."""
    image = picture
    while True:
        for quality in (85, 70, 55, 40):
            data = encode_jpeg(image, quality)
            if len(data) <= budget:
                return data
        height, width = image.shape[:2]
        if max(height, width) <= 16:
            return data  # a 16-pixel JPEG is a few hundred bytes: no budget is that small
        image = resize_to(image, max(1, int(width * 0.75)), max(1, int(height * 0.75)))


def inline_thumbnail(name: str, picture: np.ndarray, *, chart: bool = False) -> str | None:
    """The Markdown image of the largest thumbnail that Dagster draws in place: a JPEG, or for a
    chart (flat colours, sharp lines) a PNG of 8 or 4 colours where that is larger."""
    for width in _THUMBNAIL_WIDTHS:
        small = resize_to(picture, width, width)
        for kind, data in _thumbnail_encodings(small, chart):
            markdown = _markdown_image(name, data, kind)
            if len(markdown) < INLINE_MARKDOWN_LIMIT:
                return markdown
    return None


def _thumbnail_encodings(small: np.ndarray, chart: bool) -> Iterator[tuple[str, bytes]]:
    for quality in _THUMBNAIL_QUALITIES:
        yield "jpeg", encode_jpeg(small, quality)
    if chart:
        for colours in (8, 4):
            yield "png", encode_palette_png(small, colours)


def _markdown_image(name: str, data: bytes, kind: str) -> str:
    return f"![{name}](data:image/{kind};base64,{base64.b64encode(data).decode()})"


def previews(metadata: Mapping[str, Any]) -> list[Preview]:
    """The `Preview`s among a stage's metadata values."""
    return [value for value in metadata.values() if isinstance(value, Preview)]


def ui_metadata(metadata: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """What the UI receives for a stage's metadata: previews first (thumbnail, picture, the file's
    path), then every value made readable (`readable`); and the event's description: its
    `outcome` in words (None without one), which the run log shows as the event's message."""
    shown: dict[str, Any] = {}
    for preview in previews(metadata):
        if preview.thumbnail_markdown is not None:
            shown[preview.name] = dg.MetadataValue.md(preview.thumbnail_markdown)
        shown[f"{preview.name}_picture"] = dg.MetadataValue.md(preview.picture_markdown())
        shown[f"{preview.name}_file"] = dg.MetadataValue.path(preview.file)
    for key, value in metadata.items():
        if not isinstance(value, Preview):
            shown[key] = readable(value)
    outcome = metadata.get("outcome")
    return shown, outcome if isinstance(outcome, str) else None


def readable(value: Any) -> Any:
    """A metadata value as a person reads it: floats rounded to 3 places (NaN and infinities as
    text), NumPy scalars as Python numbers, paths as paths; other values unchanged."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return round(value, DECIMALS) if math.isfinite(value) else str(value)
    if isinstance(value, Path):
        return dg.MetadataValue.path(value)
    return value


def megabytes(size_bytes: int | None) -> float | None:
    """A file size in MB (10^6 bytes), 2 places: for a metadata entry named `..._mb`."""
    return None if size_bytes is None else round(size_bytes / 1e6, 2)
