"""Choosing the filter's positive threshold from a person's yes/no answers on a sample of frames.

The sample: the project's frames are split into strata by their best positive prompt and, within
a prompt, by equal-width bins of the logit of that score between its lowest and highest value,
so every part of every prompt's score range is looked at, not only the crowd of low scores.
Each stratum gives the same number of frames (a smaller one all of its frames, the rest going
to the others), drawn at random and shown in random order.

The estimates are for the whole project, not for the sample: an answered frame stands for
N_h / n_h frames of its stratum (N_h frames in it, n_h answered). At a threshold t a frame is
kept when its best positive score is above t and the rest of the filter rule (negative and junk
prompts, margins) lets it through; precision is the weighted share of kept frames answered yes,
recall the weighted share of yes frames kept. Their 95 % intervals are Wilson intervals at the
design's effective sample size: p(1 - p) over the stratified variance of the ratio (Taylor
linearisation, finite-population corrected), or the answered frames of its denominator where
that variance is zero.

Pure NumPy: no Dagster, no SQL (the CLI reads the filter tables and stores sample and answers).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dataminer_dagster.assets.filter.filter_rule import Thresholds, apply_filter_rule

Z_95 = 1.959963984540054
MAX_BINS_PER_PROMPT = 8
MIN_PER_STRATUM = 4  # answers a stratum is planned for: enough to see its spread
LOGIT_CLIP = 1e-6  # scores are sigmoids: 0 and 1 in float32 are ends of the range, not infinities


@dataclass(frozen=True)
class Stratum:
    prompt: int  # index of the best positive prompt of its frames
    low: float  # its frames' scores are in [low, high] (the last bin of a prompt includes high)
    high: float
    size: int  # frames of the project in it


@dataclass(frozen=True)
class Sample:
    strata: tuple[Stratum, ...]
    frames: np.ndarray  # int64 positions in the population, in the order they are shown
    stratum_of: np.ndarray  # int64 stratum of each sampled frame


def logit(scores: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(scores, np.float64), LOGIT_CLIP, 1.0 - LOGIT_CLIP)
    return np.log(p) - np.log1p(-p)


def bins_per_prompt(frames: int, prompts: int) -> int:
    """Score bins per prompt for a sample of `frames`: MIN_PER_STRATUM answers each, 1 to
    MAX_BINS_PER_PROMPT."""
    return max(1, min(MAX_BINS_PER_PROMPT, frames // (MIN_PER_STRATUM * max(prompts, 1))))


def stratify(
    scores: np.ndarray, best_prompt: np.ndarray, bins: int
) -> tuple[tuple[Stratum, ...], np.ndarray]:
    """The non-empty strata of the population and each frame's stratum: per best prompt,
    `bins` equal-width bins of logit(score) from the prompt's lowest score to its highest."""
    scores = np.asarray(scores, np.float64)
    best_prompt = np.asarray(best_prompt, np.int64)
    stratum_of = np.full(len(scores), -1, np.int64)
    strata: list[Stratum] = []
    for prompt in np.unique(best_prompt):
        members = np.flatnonzero(best_prompt == prompt)
        x = logit(scores[members])
        lo, hi = float(x.min()), float(x.max())
        edges = np.linspace(lo, hi, bins + 1)
        position = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
        for b in range(bins):
            in_bin = members[position == b]
            if len(in_bin):
                stratum_of[in_bin] = len(strata)
                s = scores[in_bin]
                strata.append(Stratum(int(prompt), float(s.min()), float(s.max()), len(in_bin)))
    return tuple(strata), stratum_of


def allocate(sizes: Sequence[int], frames: int) -> list[int]:
    """Frames to draw from each stratum: as equal as the sizes allow, `frames` in all (or every
    frame where there are fewer); a stratum whose frames run out gives its share to the others."""
    take = [0] * len(sizes)
    for _ in range(min(frames, sum(sizes))):
        fewest = min((t, i) for i, (t, n) in enumerate(zip(take, sizes, strict=True)) if t < n)
        take[fewest[1]] += 1
    return take


def draw_sample(scores: np.ndarray, best_prompt: np.ndarray, frames: int, seed: int) -> Sample:
    """A stratified sample of `frames` frames of the population (each frame's best positive
    score and best prompt); the same seed draws the same sample."""
    if frames < 1:
        raise ValueError(f"a sample needs at least one frame, not {frames}")
    if len(scores) == 0:
        raise ValueError("there are no frames to sample")
    prompts = len(np.unique(best_prompt))
    strata, stratum_of = stratify(scores, best_prompt, bins_per_prompt(frames, prompts))
    rng = np.random.default_rng(seed)
    picked, picked_stratum = [], []
    for h, count in enumerate(allocate([s.size for s in strata], frames)):
        members = np.flatnonzero(stratum_of == h)
        picked.append(rng.choice(members, size=count, replace=False))
        picked_stratum.append(np.full(count, h, np.int64))
    chosen, chosen_stratum = np.concatenate(picked), np.concatenate(picked_stratum)
    order = rng.permutation(len(chosen))  # shown mixed: the order says nothing about the score
    return Sample(strata, chosen[order].astype(np.int64), chosen_stratum[order])


def kept_apart_from_threshold(
    scores: np.ndarray, *, n_positive: int, n_negative: int, n_junk: int, thresholds: Thresholds
) -> np.ndarray:
    """Per frame: whether the filter rule keeps it once its best positive score clears the
    positive threshold, i.e. whether its negative and junk prompts and margins let it through."""
    return apply_filter_rule(
        scores,
        n_positive=n_positive,
        n_negative=n_negative,
        n_junk=n_junk,
        thresholds=_AnyPositive(
            -math.inf,
            thresholds.negative_threshold,
            thresholds.pos_neg_margin,
            thresholds.junk_threshold,
            thresholds.pos_junk_margin,
        ),
    ).passed


@dataclass(frozen=True)
class _AnyPositive:
    """The rule's thresholds with every positive score clearing its threshold."""

    positive_threshold: float
    negative_threshold: float
    pos_neg_margin: float
    junk_threshold: float
    pos_junk_margin: float


def wilson(p: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion `p` seen on `n` (an effective size: not
    necessarily whole; infinite for a census)."""
    if n <= 0 or math.isnan(p):
        return (0.0, 1.0)
    if math.isinf(n):
        return (p, p)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Answers:
    """The answered frames of a sample: each one's stratum, best positive score, whether the
    rest of the rule lets it through, and the answer (True: it is what the project wants)."""

    strata: tuple[Stratum, ...]
    stratum_of: np.ndarray
    score: np.ndarray
    rule_allows: np.ndarray
    yes: np.ndarray

    def __post_init__(self) -> None:
        lengths = {len(self.stratum_of), len(self.score), len(self.rule_allows), len(self.yes)}
        if len(lengths) != 1:
            raise ValueError(f"the answers' arrays differ in length: {sorted(lengths)}")

    @property
    def answered_per_stratum(self) -> np.ndarray:
        return np.bincount(self.stratum_of, minlength=len(self.strata))

    @property
    def weights(self) -> np.ndarray:
        """Frames of the project each answer stands for (N_h / n_h)."""
        sizes = np.array([s.size for s in self.strata], np.float64)
        answered = np.maximum(self.answered_per_stratum, 1)
        return (sizes / answered)[self.stratum_of]

    @property
    def uncovered(self) -> int:
        """Frames of the project in strata where no frame was answered: no estimate covers them."""
        answered = self.answered_per_stratum
        return sum(s.size for h, s in enumerate(self.strata) if answered[h] == 0)

    def of_prompt(self, prompt: int) -> Answers:
        """The answers about the frames whose best positive prompt is `prompt`, as a sample of
        those frames alone."""
        keep = np.array([s.prompt == prompt for s in self.strata], bool)
        renumber = np.cumsum(keep) - 1
        rows = keep[self.stratum_of]
        return Answers(
            tuple(s for s, k in zip(self.strata, keep, strict=True) if k),
            renumber[self.stratum_of[rows]],
            self.score[rows],
            self.rule_allows[rows],
            self.yes[rows],
        )


@dataclass(frozen=True)
class Estimate:
    """Precision and recall of the filter at one positive threshold, for the whole project."""

    threshold: float
    precision: float  # NaN where no answered frame is kept
    precision_interval: tuple[float, float]
    recall: float  # NaN where no frame was answered yes
    recall_interval: tuple[float, float]

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        if math.isnan(p) or math.isnan(r) or p + r == 0:
            return 0.0
        return 2 * p * r / (p + r)


def _ratio(answers: Answers, numerator: np.ndarray, denominator: np.ndarray):
    """Weighted ratio sum(w a) / sum(w b) and its Wilson interval (module docstring)."""
    w = answers.weights
    a, b = numerator.astype(np.float64), denominator.astype(np.float64)
    total = float(np.sum(w * b))
    if total == 0:
        return math.nan, (0.0, 1.0)
    ratio = float(np.sum(w * a)) / total
    residual = a - ratio * b
    variance = 0.0
    answered = answers.answered_per_stratum
    census = all(n == 0 or n >= s.size for n, s in zip(answered, answers.strata, strict=True))
    if census:  # every frame of every stratum answered: no sampling error
        return ratio, (ratio, ratio)
    for h, stratum in enumerate(answers.strata):
        n = answered[h]
        if n == 0 or n >= stratum.size:
            continue
        u = residual[answers.stratum_of == h]
        # One answer gives no spread of its own: its residual's square stands in (the residuals
        # of the whole have mean 0).
        spread = float(np.var(u, ddof=1)) if n > 1 else float(u[0] ** 2)
        variance += stratum.size**2 * (1 - n / stratum.size) * spread / n
    variance /= total**2
    if 0 < ratio < 1 and variance > 0:
        effective = ratio * (1 - ratio) / variance
    else:  # all yes or all no where it was sampled: as many answers as say so
        effective = float(np.count_nonzero(b))
    return ratio, wilson(ratio, effective)


def estimate(answers: Answers, threshold: float) -> Estimate:
    """Precision and recall at `threshold` (kept: score above it, strictly, as the rule says)."""
    kept = answers.rule_allows & (answers.score.astype(np.float32) > np.float32(threshold))
    precision, precision_interval = _ratio(answers, answers.yes & kept, kept)
    recall, recall_interval = _ratio(answers, answers.yes & kept, answers.yes)
    return Estimate(
        threshold,
        precision,
        precision_interval,
        recall,
        recall_interval,
    )


def candidate_thresholds(answers: Answers) -> list[float]:
    """The thresholds between which the estimates change: 0, then one between each two
    consecutive distinct answered scores, near the middle of what the sample cannot tell apart
    and written with few decimals."""
    scores = np.unique(answers.score.astype(np.float32))
    return [
        0.0,
        *(_between(float(a), float(b)) for a, b in zip(scores[:-1], scores[1:], strict=True)),
    ]


def _between(low: float, high: float) -> float:
    """The midpoint of (low, high), rounded to the fewest decimals that keep a frame scored
    `low` out and one scored `high` in (the rule compares in float32, strictly)."""
    middle = (low + high) / 2
    for decimals in range(2, 9):
        t = round(middle, decimals)
        if np.float32(low) <= np.float32(t) < np.float32(high):
            return t
    return middle


def curve(answers: Answers) -> list[Estimate]:
    return [estimate(answers, t) for t in candidate_thresholds(answers)]


@dataclass(frozen=True)
class Choice:
    estimate: Estimate | None  # None: no threshold reaches the precision asked for
    goal: str  # what was asked: "precision >= 0.95" or "best F1"


def choose_threshold(estimates: Sequence[Estimate], precision: float | None = None) -> Choice:
    """With `precision`: the lowest threshold whose estimated precision reaches it (the most
    recall at that precision). Without: the threshold of the best F1 (the lowest of equals)."""
    if precision is None:
        best = max(estimates, key=lambda e: (e.f1, -e.threshold), default=None)
        return Choice(best if best is not None and best.f1 > 0 else None, "best F1")
    reaching = [e for e in estimates if not math.isnan(e.precision) and e.precision >= precision]
    return Choice(
        min(reaching, key=lambda e: e.threshold, default=None), f"precision >= {precision:g}"
    )


def report_thresholds(answers: Answers, count: int, also: Sequence[float] = ()) -> list[float]:
    """Thresholds for a table of `count` rows evenly over the logit of the answered scores, and
    the thresholds in `also` (the config's, the chosen one)."""
    x = logit(answers.score)
    grid = 1.0 / (1.0 + np.exp(-np.linspace(x.min(), x.max(), count))) if len(x) else []
    return sorted({round(float(t), 4) for t in grid} | {float(t) for t in also})
