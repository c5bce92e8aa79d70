"""The frame-filter decision rule: every threshold and margin, equality included (strict)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataminer_dagster.assets.filter.filter_rule import apply_filter_rule
from dataminer_dagster.models.siglip import sigmoid_scores


@dataclass(frozen=True)
class FilterThresholds:
    """The rule's thresholds without a project config (assets.filter.filter_rule.Thresholds)."""

    positive_threshold: float
    negative_threshold: float
    pos_neg_margin: float
    junk_threshold: float
    pos_junk_margin: float


# All values are multiples of 1/8, exact in binary, so margins compare without rounding.
THRESHOLDS = FilterThresholds(
    positive_threshold=0.5,
    negative_threshold=0.5,
    pos_neg_margin=0.25,
    junk_threshold=0.5,
    pos_junk_margin=0.25,
)


def decide_one(pos, neg, junk, t=THRESHOLDS) -> bool:
    """The rule for one frame, written out literally as in the reference."""
    pos_max = max(pos)
    passed = pos_max > t.positive_threshold
    if neg:
        passed = (
            passed and max(neg) < t.negative_threshold and pos_max - max(neg) > t.pos_neg_margin
        )
    if junk:
        passed = passed and max(junk) < t.junk_threshold and pos_max - max(junk) > t.pos_junk_margin
    return passed


def run(pos, neg=(), junk=(), t=THRESHOLDS, dtype=np.float64):
    scores = np.array([list(pos) + list(neg) + list(junk)], dtype=dtype)
    return apply_filter_rule(
        scores, n_positive=len(pos), n_negative=len(neg), n_junk=len(junk), thresholds=t
    )


@pytest.mark.parametrize(
    ("case", "pos", "neg", "junk", "expected"),
    [
        # positive threshold alone
        ("positive above", [0.625], [], [], True),
        ("positive equal fails", [0.5], [], [], False),
        ("positive below", [0.375], [], [], False),
        ("best positive counts", [0.125, 0.75, 0.25], [], [], True),
        # negative threshold and margin
        ("negative clear", [0.875], [0.25], [], True),
        ("negative equal fails", [1.0], [0.5], [], False),
        ("negative above", [1.0], [0.625], [], False),
        ("pos-neg margin equal fails", [0.625], [0.375], [], False),
        ("pos-neg margin above", [0.75], [0.375], [], True),
        ("worst negative counts", [0.875], [0.0, 0.625], [], False),
        # junk threshold and margin
        ("junk clear", [0.875], [], [0.25], True),
        ("junk equal fails", [1.0], [], [0.5], False),
        ("junk above", [1.0], [], [0.75], False),
        ("pos-junk margin equal fails", [0.625], [], [0.375], False),
        ("pos-junk margin above", [0.75], [], [0.375], True),
        # all groups
        ("all clear", [0.875, 0.5], [0.25, 0.125], [0.25], True),
        ("junk alone fails", [0.875], [0.25], [0.625], False),
        ("negative alone fails", [0.875], [0.625], [0.25], False),
        ("positive alone fails", [0.5], [0.0], [0.0], False),
    ],
)
def test_rule_table(case, pos, neg, junk, expected):
    decision = run(pos, neg, junk)
    assert bool(decision.passed[0]) is expected, case
    assert decide_one(pos, neg, junk) is expected, f"table entry disagrees with the rule: {case}"


def test_margins_use_their_own_thresholds():
    t = FilterThresholds(
        positive_threshold=0.25,
        negative_threshold=0.75,
        pos_neg_margin=0.5,
        junk_threshold=0.75,
        pos_junk_margin=0.125,
    )
    # lead over the negative 0.5 == margin -> fails; lead over junk 0.5 > 0.125 -> fine
    assert not run([0.75], [0.25], [0.25], t=t).passed[0]
    assert run([0.875], [0.25], [0.25], t=t).passed[0]
    # lead over junk 0.125 == margin -> fails
    assert not run([0.625], [0.0], [0.5], t=t).passed[0]
    assert run([0.6875], [0.0], [0.5], t=t).passed[0]


def test_outputs_per_frame():
    scores = np.array(
        [
            [0.25, 0.875, 0.125, 0.375, 0.0],
            [0.75, 0.5, 0.625, 0.0, 0.125],
        ],
        dtype=np.float32,
    )
    d = apply_filter_rule(scores, n_positive=2, n_negative=2, n_junk=1, thresholds=THRESHOLDS)
    np.testing.assert_array_equal(d.passed, [True, False])
    np.testing.assert_array_equal(d.pos_max, [0.875, 0.75])
    np.testing.assert_array_equal(d.neg_max, [0.375, 0.625])
    np.testing.assert_array_equal(d.junk_max, [0.0, 0.125])
    np.testing.assert_array_equal(d.best_positive, [1, 0])
    assert d.best_positive.dtype == np.int64
    assert d.pos_max.dtype == np.float32


def test_missing_groups_give_nan():
    d = run([0.75, 0.25])
    assert math.isnan(d.neg_max[0]) and math.isnan(d.junk_max[0])
    d = run([0.75], neg=[0.125])
    assert d.neg_max[0] == 0.125 and math.isnan(d.junk_max[0])


def test_float32_scores_compare_in_float32_like_the_reference():
    # float32(0.3) is slightly above the double 0.3, but equal to the threshold rounded to
    # float32: the model's float32 score fails, as it did in the reference.
    t = FilterThresholds(
        positive_threshold=0.3,
        negative_threshold=0.3,
        pos_neg_margin=0.1,
        junk_threshold=0.3,
        pos_junk_margin=0.1,
    )
    assert not run([0.3], t=t, dtype=np.float32).passed[0]
    assert run([float(np.float32(0.3))], t=t, dtype=np.float64).passed[0]


def test_no_frames():
    d = apply_filter_rule(
        np.zeros((0, 3), np.float32), n_positive=1, n_negative=1, n_junk=1, thresholds=THRESHOLDS
    )
    assert d.passed.shape == d.pos_max.shape == d.best_positive.shape == (0,)


@pytest.mark.parametrize(
    ("shape", "counts", "message"),
    [
        ((2, 3), (0, 2, 1), "at least one positive"),
        ((2, 3), (1, 1, 2), "shape"),
        ((3,), (1, 1, 1), "shape"),
        ((2, 3), (2, -1, 2), "must not be negative"),
    ],
)
def test_bad_input(shape, counts, message):
    n_positive, n_negative, n_junk = counts
    with pytest.raises(ValueError, match=message):
        apply_filter_rule(
            np.zeros(shape),
            n_positive=n_positive,
            n_negative=n_negative,
            n_junk=n_junk,
            thresholds=THRESHOLDS,
        )


eighths = st.integers(0, 8).map(lambda k: k / 8)


@settings(max_examples=200, deadline=None)
@given(
    pos=st.lists(eighths, min_size=1, max_size=3),
    neg=st.lists(eighths, max_size=3),
    junk=st.lists(eighths, max_size=3),
    t=st.builds(FilterThresholds, eighths, eighths, eighths, eighths, eighths),
)
def test_vectorised_rule_matches_the_literal_rule(pos, neg, junk, t):
    assert bool(run(pos, neg, junk, t=t).passed[0]) is decide_one(pos, neg, junk, t)


def test_sigmoid_scores():
    image = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    text = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    scores = sigmoid_scores(image, text, logit_scale=math.log(10.0), logit_bias=-2.0)
    expected = 1 / (1 + np.exp(-(image @ text.T * 10.0 - 2.0)))
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    assert scores.dtype == np.float32
    extreme = sigmoid_scores(image, text, logit_scale=10.0, logit_bias=0.0)
    assert np.all((extreme >= 0) & (extreme <= 1)) and np.isfinite(extreme).all()
    with pytest.raises(ValueError, match="same D"):
        sigmoid_scores(image, np.zeros((2, 3), np.float32), logit_scale=0.0, logit_bias=0.0)
