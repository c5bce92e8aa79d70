"""The measures of bench/quality.py, pure and small enough to check by hand
(tests/test_quality_metrics.py).

Boxes are (x, y, width, height) in pixels, as the world's truth and the pipeline's COCO files
give them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from dataminer_dagster.core.coco import box_iou

IOU_MATCH = 0.5  # mAP50: a box is right when it overlaps a truth box of its class this much
RECALL_POINTS = np.linspace(0.0, 1.0, 101)  # COCO's (and Ultralytics') interpolation


@dataclass(frozen=True)
class PrecisionRecall:
    correct: int  # predicted items that are right
    predicted: int
    found: int  # relevant items that were predicted
    relevant: int

    @property
    def precision(self) -> float:
        """Of what was predicted, the share that is right (1.0 when nothing was predicted)."""
        return self.correct / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        """Of what is relevant, the share that was predicted (1.0 when nothing is)."""
        return self.found / self.relevant if self.relevant else 1.0


def frame_precision_recall(
    kept: Sequence[bool], shows: Sequence[bool], clearly: Sequence[bool]
) -> PrecisionRecall:
    """Precision over the kept frames, right when they show what was asked for at all (`shows`);
    recall over the frames that show it clearly (`clearly`, a subset of `shows`). So a kept frame
    with a sliver of the object is no mistake, and a dropped one is none missed."""
    kept, shows, clearly = (np.asarray(a, dtype=bool) for a in (kept, shows, clearly))
    if (clearly & ~shows).any():
        raise ValueError("a frame that shows something clearly must show it")
    return PrecisionRecall(
        correct=int((kept & shows).sum()),
        predicted=int(kept.sum()),
        found=int((kept & clearly).sum()),
        relevant=int(clearly.sum()),
    )


def _pairs(counts: Counter) -> int:
    return sum(n * (n - 1) // 2 for n in counts.values())


def pair_precision_recall(
    predicted: Sequence[Hashable], true: Sequence[Hashable]
) -> PrecisionRecall:
    """Pairs of items put in one group, against pairs that belong in one: item i's predicted group
    is predicted[i] and its true group true[i]. A pair is every unordered pair of two items."""
    if len(predicted) != len(true):
        raise ValueError(f"{len(predicted)} predicted groups for {len(true)} items")
    both = _pairs(Counter(zip(predicted, true, strict=True)))
    return PrecisionRecall(
        correct=both,
        predicted=_pairs(Counter(predicted)),
        found=both,
        relevant=_pairs(Counter(true)),
    )


def pairs_across(groups: Sequence[Hashable], parts: Sequence[Hashable]) -> int:
    """Pairs of items of one group that lie in different parts (near-duplicates across splits)."""
    if len(groups) != len(parts):
        raise ValueError(f"{len(groups)} groups for {len(parts)} items")
    return _pairs(Counter(groups)) - _pairs(Counter(zip(groups, parts, strict=True)))


Box = tuple[str, tuple[float, float, float, float]]  # (class, box)
ScoredBox = tuple[str, float, tuple[float, float, float, float]]  # (class, score, box)


def average_precision(scores: Sequence[float], correct: Sequence[bool], relevant: int) -> float:
    """The area under the precision-recall curve of detections (their scores, whether each
    matched a truth box) against `relevant` truth boxes: precision made non-increasing, read at
    101 recall points (COCO's rule)."""
    if relevant == 0:
        raise ValueError("average precision needs at least one truth box")
    order = np.argsort(-np.asarray(scores, dtype=float), kind="stable")
    hits = np.asarray(correct, dtype=bool)[order]
    tp = np.cumsum(hits)
    recall = tp / relevant
    precision = tp / np.arange(1, len(hits) + 1)
    envelope = np.maximum.accumulate(precision[::-1])[::-1] if len(hits) else precision
    at = np.searchsorted(recall, RECALL_POINTS, side="left")
    read = np.array([envelope[i] if i < len(envelope) else 0.0 for i in at])
    return float(read.mean())


def map50(
    predictions: Sequence[Sequence[ScoredBox]], truths: Sequence[Sequence[Box]]
) -> tuple[float, dict[str, float]]:
    """mAP at IoU 0.5 over images (predictions[i] and truths[i] are image i's): in each image,
    detections in decreasing score take the unmatched truth box of their class they overlap most,
    if by IoU >= 0.5; the mean of the classes' average precision over the classes with a truth
    box (a class only predicted adds nothing, as in COCO and Ultralytics). Also per class."""
    if len(predictions) != len(truths):
        raise ValueError(f"predictions for {len(predictions)} images, truth for {len(truths)}")
    scores: dict[str, list[float]] = {}
    correct: dict[str, list[bool]] = {}
    relevant = Counter(cls for boxes in truths for cls, _ in boxes)
    for found, wanted in zip(predictions, truths, strict=True):
        taken = [False] * len(wanted)
        for cls, score, box in sorted(found, key=lambda p: -p[1]):
            best, best_iou = None, IOU_MATCH
            for k, (truth_cls, truth_box) in enumerate(wanted):
                if truth_cls != cls or taken[k]:
                    continue
                overlap = box_iou(box, truth_box)
                if overlap >= best_iou:
                    best, best_iou = k, overlap
            if best is not None:
                taken[best] = True
            scores.setdefault(cls, []).append(score)
            correct.setdefault(cls, []).append(best is not None)
    per_class = {
        cls: average_precision(scores.get(cls, []), correct.get(cls, []), n)
        for cls, n in sorted(relevant.items())
    }
    mean = float(np.mean(list(per_class.values()))) if per_class else 0.0
    return mean, per_class
