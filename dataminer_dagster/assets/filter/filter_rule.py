"""The frame-filter decision: SigLIP prompt scores in, keep-or-drop per frame out.

Prompts are ordered positive + negative + junk and scored per frame with SigLIP's sigmoid head.
A frame passes when its best positive prompt clears `positive_threshold`, and, for each of the optional
negative and junk groups, the group's best score stays below its threshold and the positive lead
over it is larger than the margin. Every comparison is strict, so a score exactly on a threshold
or a lead exactly equal to a margin fails. This is the reference system's rule, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Thresholds(Protocol):
    """Thresholds of the decision rule, by the names of the project config's `filter:` section,
    which is one (it is passed as it is); there are no defaults.

    positive_threshold: best positive score must be above this.
    negative_threshold: best negative score must be below this (when there are negative prompts).
    pos_neg_margin:     best positive minus best negative must be above this.
    junk_threshold:     best junk score must be below this (when there are junk prompts).
    pos_junk_margin:    best positive minus best junk must be above this.
    """

    positive_threshold: float
    negative_threshold: float
    pos_neg_margin: float
    junk_threshold: float
    pos_junk_margin: float


_THRESHOLD_NAMES = tuple(Thresholds.__annotations__)


@dataclass(frozen=True)
class FilterDecision:
    """Per-frame results of `apply_filter_rule`, each an array of length N (frames)."""

    passed: np.ndarray  # bool
    pos_max: np.ndarray  # best positive score, in the dtype of the scores
    neg_max: np.ndarray  # best negative score; NaN when there are no negative prompts
    junk_max: np.ndarray  # best junk score; NaN when there are no junk prompts
    best_positive: np.ndarray  # int64, index of the best positive prompt (a column of `scores`)


def apply_filter_rule(
    scores: np.ndarray,
    *,
    n_positive: int,
    n_negative: int,
    n_junk: int,
    thresholds: Thresholds,
) -> FilterDecision:
    """Decide for each frame (row of `scores`, shape (N, n_positive + n_negative + n_junk)).

    Columns are the prompts in the order positive, negative, junk. The arithmetic runs in the
    floating dtype of `scores` (float32 from the model) with the thresholds rounded to that dtype,
    as the reference did when it compared float32 tensors with Python floats: a float32 score of
    0.3 does not pass a threshold of 0.3.
    """
    if n_positive < 1:
        raise ValueError("the filter needs at least one positive prompt")
    if n_negative < 0 or n_junk < 0:
        raise ValueError(f"prompt counts must not be negative, got {n_negative=} and {n_junk=}")
    scores = np.asarray(scores)
    if not np.issubdtype(scores.dtype, np.floating):
        scores = scores.astype(np.float64)
    n_prompts = n_positive + n_negative + n_junk
    if scores.ndim != 2 or scores.shape[1] != n_prompts:
        raise ValueError(
            f"scores must have shape (frames, {n_prompts}) for {n_positive} positive, "
            f"{n_negative} negative and {n_junk} junk prompts, got {scores.shape}"
        )
    n_frames = scores.shape[0]
    limit = {name: scores.dtype.type(getattr(thresholds, name)) for name in _THRESHOLD_NAMES}
    positive = scores[:, :n_positive]
    pos_max = positive.max(axis=1)
    best_positive = positive.argmax(axis=1).astype(np.int64)
    passed = pos_max > limit["positive_threshold"]

    neg_max = np.full(n_frames, np.nan, dtype=scores.dtype)
    if n_negative:
        neg_max = scores[:, n_positive : n_positive + n_negative].max(axis=1)
        passed &= (neg_max < limit["negative_threshold"]) & (
            pos_max - neg_max > limit["pos_neg_margin"]
        )

    junk_max = np.full(n_frames, np.nan, dtype=scores.dtype)
    if n_junk:
        junk_max = scores[:, n_positive + n_negative :].max(axis=1)
        passed &= (junk_max < limit["junk_threshold"]) & (
            pos_max - junk_max > limit["pos_junk_margin"]
        )

    return FilterDecision(
        passed=passed,
        pos_max=pos_max,
        neg_max=neg_max,
        junk_max=junk_max,
        best_positive=best_positive,
    )
