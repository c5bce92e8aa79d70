"""bench/quality_metrics.py, and bench/quality.py's colour check, on cases worked out by hand: the
figures bench/quality.py publishes rest on them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dataminer_dagster.core.coco import box_iou

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from quality_metrics import (  # noqa: E402 - bench/ is no package
    average_precision,
    frame_precision_recall,
    map50,
    pair_precision_recall,
    pairs_across,
)


def test_frame_precision_counts_slivers_as_right_and_recall_only_clear_frames():
    kept = [True, True, True, False, False, False]
    shows = [True, True, False, True, True, False]
    clearly = [True, False, False, True, False, False]
    figures = frame_precision_recall(kept, shows, clearly)
    assert (figures.correct, figures.predicted, figures.found, figures.relevant) == (2, 3, 1, 2)
    assert figures.precision == pytest.approx(2 / 3)
    assert figures.recall == pytest.approx(1 / 2)
    with pytest.raises(ValueError):
        frame_precision_recall([True], [False], [True])


def test_pair_precision_and_recall():
    # true groups {0,1,2} {3,4}: 4 true pairs. Predicted {0,1} {2,3,4}: pairs 01, 23, 24, 34.
    figures = pair_precision_recall(["a", "a", "b", "b", "b"], [1, 1, 1, 2, 2])
    assert (figures.correct, figures.predicted, figures.relevant) == (2, 4, 4)
    assert figures.precision == 0.5 and figures.recall == 0.5
    assert pair_precision_recall([1, 2, 3], [1, 2, 3]).precision == 1.0  # no pair predicted
    perfect = pair_precision_recall(["x", "x", "y"], [7, 7, 8])
    assert (perfect.precision, perfect.recall) == (1.0, 1.0)


def test_pairs_across_splits():
    groups = ["g", "g", "g", "h", "h", "k"]
    splits = ["train", "train", "val", "test", "test", "val"]
    assert pairs_across(groups, splits) == 2  # g: the val item with each train item
    assert pairs_across(groups, ["train"] * 6) == 0


def test_iou():
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 0, 10, 10)) == pytest.approx(50 / 150)
    assert box_iou((0, 0, 10, 10), (20, 20, 5, 5)) == 0.0


TRUTH = [
    [("circle", (10, 10, 20, 20)), ("star", (50, 40, 30, 30))],
    [("circle", (0, 0, 40, 40))],
]


def test_map50_of_perfect_boxes_is_one():
    predictions = [[(cls, 0.9, box) for cls, box in image] for image in TRUTH]
    mean, per_class = map50(predictions, TRUTH)
    assert mean == pytest.approx(1.0)
    assert per_class == {"circle": pytest.approx(1.0), "star": pytest.approx(1.0)}


def test_map50_of_boxes_shifted_past_half_overlap_is_zero():
    # shifted by 10 of 20 px: IoU 1/3; by 4 of 40 px: IoU 0.82 (still right)
    predictions = [
        [("circle", 0.9, (20, 10, 20, 20)), ("star", 0.8, (50, 40, 30, 30))],
        [("circle", 0.7, (4, 0, 40, 40))],
    ]
    mean, per_class = map50(predictions, TRUTH)
    # circle: detections 0.9 wrong, 0.7 right of 2 boxes: precision 1/2 up to recall 1/2
    assert per_class["circle"] == pytest.approx(51 / 101 * 0.5)
    assert per_class["star"] == pytest.approx(1.0)
    assert mean == pytest.approx((51 / 101 * 0.5 + 1.0) / 2)


def test_map50_wrong_class_duplicates_and_misses():
    predictions = [
        # the right box twice (the second is a false positive), a star called a circle
        [("circle", 0.9, (10, 10, 20, 20)), ("circle", 0.8, (10, 10, 20, 20))],
        [("square", 0.95, (0, 0, 40, 40))],  # a class with no truth adds nothing
    ]
    mean, per_class = map50(predictions, TRUTH)
    # circle: right at 0.9, wrong at 0.8, second box never found: precision 1 up to recall 1/2
    assert per_class["circle"] == pytest.approx(51 / 101)
    assert per_class["star"] == 0.0
    assert set(per_class) == {"circle", "star"}
    assert mean == pytest.approx(51 / 101 / 2)


def test_average_precision_reads_the_precision_envelope():
    # right, wrong, right of 2: precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1 -> envelope 1 then 2/3
    assert average_precision([0.9, 0.8, 0.7], [True, False, True], 2) == pytest.approx(
        (51 * 1 + 50 * 2 / 3) / 101
    )
    assert average_precision([], [], 3) == 0.0


def test_the_colour_check_keeps_a_mirrored_copy_and_vetoes_another_scene_the_embedding_joins():
    import numpy as np
    from quality import colour_overlap, grouped_at  # bench/quality.py

    def histogram(shares: dict[int, float]) -> np.ndarray:
        counts = np.zeros(8**3)
        for bin_, share in shares.items():
            counts[bin_] = share
        return counts

    scene = histogram({0: 0.7, 9: 0.3})  # a frame and its mirror have the same colours
    other = histogram({0: 0.2, 200: 0.8})  # another background
    overlap = colour_overlap(np.stack([scene, scene, other]))
    assert overlap[0, 1] == pytest.approx(1.0)
    assert overlap[0, 2] == pytest.approx(0.2)
    alike = np.ones((3, 4), np.float32) / 2  # the embedding finds all three the same
    assert grouped_at(alike, 0.6, overlap, 0.75) == [0, 0, 1]
    assert grouped_at(alike, 0.6, overlap, 0.1) == [0, 0, 0]
