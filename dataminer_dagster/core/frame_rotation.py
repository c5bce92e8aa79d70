"""Turning frames upright. A phone stores a portrait video as landscape pictures with a note to
turn them when shown: a display matrix (side data that FFmpeg hands over with every decoded
frame), or, in files written by older tools, a `rotate` tag on the stream. Players and OpenCV
follow the note; frames are stored as they show, turned by the note's multiple of 90 degrees.
An angle in between (cameras do not write one) is rounded to the nearest quarter turn, and the
mirroring a matrix may add is not undone: only the turn is read.

A rotation here is in degrees clockwise (0, 90, 180 or 270): how far the decoded picture is
turned to be upright, the convention of the `rotate` tag. FFmpeg's display matrix gives the
angle counter-clockwise, hence the change of sign.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import av


def tagged_rotation(stream: av.VideoStream) -> int:
    """The stream's `rotate` tag (any case, as Matroska stores it in capitals), 0 without one."""
    for key, value in stream.metadata.items():
        if key.lower() == "rotate":
            try:
                return _quarter_turns(float(value))
            except ValueError:
                return 0  # a tag that is not a number turns nothing
    return 0


def frame_rotation(frame: av.VideoFrame, tagged: int) -> int:
    """Degrees clockwise that turn `frame` upright: its display matrix's, else the stream's
    `rotate` tag (`tagged`, from tagged_rotation)."""
    counter_clockwise = frame.rotation  # 0 without a display matrix
    return _quarter_turns(-counter_clockwise) if counter_clockwise else tagged


def upright_size(width: int, height: int, rotation: int) -> tuple[int, int]:
    """The size of a width x height picture once turned by `rotation` degrees."""
    return (height, width) if rotation in (90, 270) else (width, height)


def turn_upright(image: np.ndarray, rotation: int) -> np.ndarray:
    """`image` (H, W, C) turned `rotation` degrees clockwise."""
    import cv2

    turns = {
        90: cv2.ROTATE_90_CLOCKWISE,
        180: cv2.ROTATE_180,
        270: cv2.ROTATE_90_COUNTERCLOCKWISE,
    }
    return cv2.rotate(image, turns[rotation]) if rotation in turns else image


def _quarter_turns(degrees: float) -> int:
    return round(degrees / 90) % 4 * 90
