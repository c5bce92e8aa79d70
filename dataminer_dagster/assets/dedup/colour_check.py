"""The colour check (dedup.colour_overlap): two frames whose embeddings are alike are duplicates
only when their colours agree too.

A frame's colours are its RGB histogram, `BINS` bins a channel (BINS**3 cells), as shares that
sum to 1; two frames' agreement is the histogram intersection, the share of pixels both
histograms hold (1: the same colours in the same shares, 0: no colour in common). A mirror, a crop,
a re-encode or a moved object change it little; another scene's background changes it a lot, where
an embedding trained on what is in the picture can find two scenes alike. It can only veto a pair
the embedding joins, never join one.

The histogram is of the frame scaled down to `SIDE` pixels on its longest side (so that a copy at
another resolution counts the same pixels), and each pixel is shared between the cells around its
colour in proportion to how near it is to each (trilinear): with hard cells a colour on a cell's
edge falls on either side of it by chance, and a JPEG re-encode of a frame whose background sat on
an edge agreed with the original by 0.77 where soft cells give 0.94.

Histograms are computed from the frame files once and kept in the embedding cache under their own
name (`HISTOGRAM_SLUG`), keyed by frame content like the embeddings. The cache stores rows of unit
length, so `histograms_from_cache` scales them back to shares.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from dataminer_dagster.core.images import ImageReadError, read_image
from dataminer_dagster.models.image_embedder import ImageBatchResult

BINS = 8
SIDE = 160
HISTOGRAM_SLUG = f"colour-histogram-rgb{BINS}-soft-{SIDE}px"
_PAIR_BLOCK = 16_384  # pairs whose histograms are compared at once (two 32 MiB blocks)


def colour_histogram(path: Path) -> np.ndarray:
    """The frame's RGB histogram as float32 shares summing to 1 (raises ImageReadError)."""
    import cv2

    image = read_image(Path(path), order="bgr")
    height, width = image.shape[:2]
    scale = SIDE / max(height, width)
    if scale < 1:
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    # Each channel's value in cell units, measured from the centre of the first cell.
    position = image.reshape(-1, 3).astype(np.float32) * np.float32(BINS / 256) - np.float32(0.5)
    below = np.floor(position)
    towards_above = position - below
    below = below.astype(np.int64)
    counts = np.zeros(BINS**3, np.float64)
    for corner in range(8):  # the 2 x 2 x 2 cells around each pixel's colour
        cell = np.zeros(len(position), np.int64)
        weight = np.ones(len(position), np.float32)
        for channel in range(3):
            above = (corner >> channel) & 1
            cell = cell * BINS + np.clip(below[:, channel] + above, 0, BINS - 1)
            share = towards_above[:, channel]
            weight *= share if above else 1 - share
        counts += np.bincount(cell, weights=weight, minlength=BINS**3)
    return (counts / counts.sum()).astype(np.float32)


def colour_histograms(paths: Sequence[Path | str]) -> ImageBatchResult:
    """The histograms of these frame files, as a batch of an image embedder: the positions read,
    their histograms and why the others could not be read."""
    positions, rows, errors = [], [], {}
    for position, path in enumerate(paths):
        try:
            rows.append(colour_histogram(Path(path)))
        except ImageReadError as error:
            errors[position] = str(error)
            continue
        positions.append(position)
    histograms = np.stack(rows) if rows else np.zeros((0, BINS**3), np.float32)
    return ImageBatchResult(np.asarray(positions, np.int64), histograms, errors)


def histograms_from_cache(rows: np.ndarray) -> np.ndarray:
    """Histograms as shares again, from the unit-length rows the embedding cache returns (rows
    already shares, and rows of zeros, stay as they are)."""
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.maximum(rows.sum(axis=1, keepdims=True), np.float32(1e-12))


def overlap(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """The histogram intersection of left[k] and right[k] for every k."""
    return np.minimum(left, right).sum(axis=1)


class ColourCheck:
    """The colour histograms of some frames and the least overlap two duplicates need."""

    def __init__(self, histograms: np.ndarray, least_overlap: float):
        self.histograms = np.asarray(histograms, dtype=np.float32)
        self.least_overlap = np.float32(least_overlap)

    def agree(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair (a[k], b[k]) of rows of `histograms`: whether their colours agree."""
        return self.agree_with(self.histograms, a, b)

    def agree_with(self, others: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Per pair (a[k], b[k]): whether row a[k] of `histograms` agrees with row b[k] of
        `others` (e.g. the kept frames' histograms)."""
        agree = np.empty(len(a), dtype=bool)
        for start in range(0, len(a), _PAIR_BLOCK):  # gathered a block at a time: a static
            stop = start + _PAIR_BLOCK  # shot's millions of pairs would gather gigabytes
            pair_overlap = overlap(
                self.histograms[a[start:stop]], np.asarray(others[b[start:stop]])
            )
            agree[start:stop] = pair_overlap >= self.least_overlap
        return agree

    def subset(self, rows: np.ndarray) -> ColourCheck:
        return ColourCheck(self.histograms[rows], float(self.least_overlap))

    def keep_agreeing(
        self, pairs: Iterator[tuple[np.ndarray, np.ndarray]], rows: np.ndarray
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The pairs (a, b) of positions in `rows` whose frames' colours agree."""
        for a, b in pairs:
            agree = self.agree(rows[a], rows[b])
            yield a[agree], b[agree]
