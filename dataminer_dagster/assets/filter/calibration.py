"""Choosing the filter's positive threshold from a person's yes/no answers on a sample of frames.

The sample: the project's frames are split into strata by their best positive prompt and, within
a prompt, by equal-width bins of the square root of that score between its lowest and highest
value, so every part of every prompt's score range is looked at, not only the crowd of low
scores. The threshold is chosen on the score itself: bins of the score would leave the low
scores, where a sigmoid's thresholds often lie, in one bin, and bins of its logit spend most of
the sample on scores far below any threshold; the square root lies between the two. Each stratum
gives the same number of frames (a smaller one all of its frames, the rest going to the others),
drawn at random and shown in random order. Frames added to an answered sample go
where one more answer is expected to narrow the precision estimate at the threshold recommended
so far the most (`allocate_more`), drawn at random within their strata as the first ones were, so
the estimates below hold for the whole sample.

The estimates are for the whole project, not for the sample. At a threshold t a frame is kept
when its best positive score is above t and the rest of the filter rule (negative and junk
prompts, margins) lets it through. How many frames of each stratum t keeps is counted, not
estimated (the sample keeps the score and stratum of every frame the rest of the rule allows);
precision is those counts weighted by the share of yes among the stratum's answered frames that
t keeps (or, where t keeps none of them, among its answered frames the rest of the rule allows),
so it moves frame by frame as t rises, not only at the answered scores. Recall is the design's:
an answered frame stands for N_h / n_h frames of its stratum (N_h frames in it, n_h answered),
and recall is the weighted share of yes frames kept. Their 95 % intervals are Wilson intervals
at the effective sample size p(1 - p) / variance: for precision the strata's binomial variances
(each share with half a yes and half a no added) weighted by their kept frames,
finite-population corrected where the answers are among the frames kept; for recall the
stratified variance of the ratio (Taylor linearisation), finite-population corrected; and the
answers they come from where the estimate is 0 or 1. The frames a threshold keeps of a stratum
none of whose kept frames was answered have their share from the stratum's lower-scored answers,
a guess: the precision interval is widened by as much as they could move the estimate, all of
them yes or all no.

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
MIN_PER_STRATUM = 2  # answers a stratum is planned for: the fewest that show its spread
THRESHOLD_BLOCK = 65536  # thresholds whose precision is worked out at once, per stratum
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
    population_strata: np.ndarray  # int64 stratum of every frame of the population


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
    `bins` equal-width bins of the square root of the score from the prompt's lowest score to its
    highest."""
    scores = np.asarray(scores, np.float64)
    best_prompt = np.asarray(best_prompt, np.int64)
    stratum_of = np.full(len(scores), -1, np.int64)
    strata: list[Stratum] = []
    for prompt in np.unique(best_prompt):
        members = np.flatnonzero(best_prompt == prompt)
        x = np.sqrt(np.clip(scores[members], 0.0, 1.0))
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
    counts = allocate([s.size for s in strata], frames)
    chosen, chosen_stratum = _draw(stratum_of, counts, np.random.default_rng(seed))
    return Sample(strata, chosen, chosen_stratum, stratum_of)


def _draw(
    stratum_of: np.ndarray, counts: Sequence[int], rng: np.random.Generator, drawn=()
) -> tuple[np.ndarray, np.ndarray]:
    """`counts[h]` frames of each stratum h at random, none of `drawn`, in random order (shown
    mixed: the order says nothing about the score): their positions and strata."""
    free = np.ones(len(stratum_of), bool)
    free[np.asarray(drawn, np.int64)] = False
    picked, picked_stratum = [], []
    for h, count in enumerate(counts):
        members = np.flatnonzero((stratum_of == h) & free)
        picked.append(rng.choice(members, size=count, replace=False))
        picked_stratum.append(np.full(count, h, np.int64))
    chosen, chosen_stratum = np.concatenate(picked), np.concatenate(picked_stratum)
    order = rng.permutation(len(chosen))
    return chosen[order].astype(np.int64), chosen_stratum[order]


def assign_strata(
    scores: np.ndarray, best_prompt: np.ndarray, strata: Sequence[Stratum]
) -> np.ndarray:
    """Each frame's stratum among `strata`, drawn from these same frames: the stratum of its
    best prompt whose score range holds its score. ValueError where they are other frames (one
    in no stratum, or a stratum of another size)."""
    scores = np.asarray(scores, np.float64)
    best_prompt = np.asarray(best_prompt, np.int64)
    stratum_of = np.full(len(scores), -1, np.int64)
    for h, stratum in enumerate(strata):
        inside = (
            (best_prompt == stratum.prompt) & (scores >= stratum.low) & (scores <= stratum.high)
        )
        stratum_of[inside] = h
    sizes = np.bincount(stratum_of[stratum_of >= 0], minlength=len(strata))
    if (stratum_of < 0).any() or any(n != s.size for n, s in zip(sizes, strata, strict=True)):
        raise ValueError("the frames are not those the strata were drawn from")
    return stratum_of


def allocate_more(
    answers: Answers, drawn: Sequence[int], frames: int, threshold: float | None
) -> list[int]:
    """Frames to add to each stratum of a sample (`drawn`: frames drawn from each so far, some
    answered in `answers`), `frames` in all or every frame left: one at a time to the stratum
    where one more answer is expected to narrow the precision estimate at `threshold` the most.
    A stratum's term of that estimate's variance is K_h^2 s_h (1 - s_h) / m_h (K_h its frames
    kept at the threshold, s_h their share of yes, m_h its answers among them; module docstring),
    and a frame drawn from the stratum is one of its kept frames not yet answered with probability
    (K_h - m_h) / (frames not drawn). Where no frame is expected to narrow it (no threshold, or
    every kept frame answered), as equal as `allocate` makes the strata."""
    sizes = np.array([s.size for s in answers.strata], np.int64)
    free = sizes - np.asarray(drawn, np.int64)
    weight = np.zeros(len(sizes))
    hit = np.zeros(len(sizes))
    known = np.zeros(len(sizes))
    if threshold is not None:
        block = _stratum_precision(_strata_frames(answers), np.array([threshold]))
        kept, known = block.kept[:, 0], block.answered_kept[:, 0].astype(np.float64)
        share = np.nan_to_num(block.share[:, 0], nan=0.5)
        weight = kept**2 * _smoothed_spread(share, known)
        hit = np.clip((kept - known) / np.maximum(free, 1), 0.0, 1.0)
    add = np.zeros(len(sizes), np.int64)
    for _ in range(min(frames, int(free.sum()))):
        expected = known + add * hit + 0.5
        gain = np.where(add < free, weight * (1 / expected - 1 / (expected + hit)), -1.0)
        if gain.max() > 0:
            add[int(np.argmax(gain))] += 1
        else:
            fewest = np.where(add < free, sizes - free + add, np.iinfo(np.int64).max)
            add[int(np.argmin(fewest))] += 1
    return add.tolist()


def draw_more(
    stratum_of: np.ndarray, drawn: np.ndarray, counts: Sequence[int], seed: int | Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """`counts[h]` more frames of each stratum h of the population (`stratum_of`: every frame's
    stratum), none of the frames `drawn` before, in random order: their positions and strata."""
    return _draw(stratum_of, counts, np.random.default_rng(seed), drawn)


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
    rest of the rule lets it through, and the answer (True: it is what the project wants); and
    the score and stratum of every frame of the project the rest of the rule lets through."""

    strata: tuple[Stratum, ...]
    stratum_of: np.ndarray
    score: np.ndarray
    rule_allows: np.ndarray
    yes: np.ndarray
    allowed_scores: np.ndarray
    allowed_strata: np.ndarray

    def __post_init__(self) -> None:
        lengths = {len(self.stratum_of), len(self.score), len(self.rule_allows), len(self.yes)}
        if len(lengths) != 1:
            raise ValueError(f"the answers' arrays differ in length: {sorted(lengths)}")
        if len(self.allowed_scores) != len(self.allowed_strata):
            raise ValueError("the allowed frames' scores and strata differ in length")

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
        allowed = keep[self.allowed_strata]
        return Answers(
            tuple(s for s, k in zip(self.strata, keep, strict=True) if k),
            renumber[self.stratum_of[rows]],
            self.score[rows],
            self.rule_allows[rows],
            self.yes[rows],
            self.allowed_scores[allowed],
            renumber[self.allowed_strata[allowed]],
        )


@dataclass(frozen=True)
class Estimate:
    """Precision and recall of the filter at one positive threshold, for the whole project."""

    threshold: float
    precision: float  # NaN where the answered strata keep no frame of the project
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
    return ratio, wilson(ratio, _effective_size(ratio, variance, np.count_nonzero(b)))


def _effective_size(ratio: float, variance: float, answered: int) -> float:
    """The sample size a proportion `ratio` with this variance stands for; where it is 0 or 1 (all
    yes or all no where it was sampled), as many as the answers it comes from."""
    if 0 < ratio < 1 and variance > 0:
        return ratio * (1 - ratio) / variance
    return float(answered)


def _above(sorted_values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """How many of `sorted_values` (ascending float32) are above each threshold, as the rule
    compares: strictly, in float32."""
    below = np.searchsorted(sorted_values, thresholds.astype(np.float32), side="right")
    return len(sorted_values) - below


@dataclass(frozen=True)
class _SumsAbove:
    """A quantity of some answered frames, summed over those above any threshold."""

    scores: np.ndarray  # float32 ascending: the frames' scores
    from_top: np.ndarray  # the quantity summed over scores[k:], for k = 0 .. len(scores)

    @classmethod
    def of(cls, scores: np.ndarray, values: np.ndarray) -> _SumsAbove:
        order = np.argsort(scores.astype(np.float32), kind="stable")
        from_top = np.concatenate([np.cumsum(values[order][::-1])[::-1], [0]])
        return cls(scores.astype(np.float32)[order], from_top)

    def count(self, thresholds: np.ndarray) -> np.ndarray:
        """How many of the frames are above each threshold."""
        return _above(self.scores, thresholds)

    def at(self, thresholds: np.ndarray) -> np.ndarray:
        """The quantity summed over the frames above each threshold."""
        return self.from_top[len(self.scores) - self.count(thresholds)]


@dataclass(frozen=True)
class _StratumFrames:
    """One stratum's frames in score order, as the precision estimate reads them."""

    allowed: np.ndarray  # float32 ascending: the project's frames the rest of the rule allows
    yes: _SumsAbove  # the yes answers among those of them that were answered
    fallback: float  # the share of yes its kept frames have where it keeps no answered one
    fallback_answers: int  # the answers that share comes from (0: nobody answered the stratum)


def _strata_frames(answers: Answers) -> list[_StratumFrames]:
    strata = []
    for h in range(len(answers.strata)):
        allowed = np.sort(answers.allowed_scores[answers.allowed_strata == h].astype(np.float32))
        mine = answers.stratum_of == h
        kept_some = mine & answers.rule_allows
        # Where it keeps none of its answered frames: the share among those the rest of the rule
        # allows (the others are never kept), or among all of its answered frames.
        source = kept_some if kept_some.any() else mine
        strata.append(
            _StratumFrames(
                allowed,
                _SumsAbove.of(answers.score[kept_some], answers.yes[kept_some]),
                float(np.mean(answers.yes[source])) if source.any() else math.nan,
                int(np.count_nonzero(source)),
            )
        )
    return strata


@dataclass(frozen=True)
class _StratumPrecision:
    """Per stratum (rows) and threshold (columns): the project's frames kept, the answered frames
    kept, and the share of yes the stratum's kept frames are taken to have."""

    kept: np.ndarray
    answered_kept: np.ndarray
    share: np.ndarray
    covered: np.ndarray  # per stratum: whether any frame of it was answered


def _stratum_precision(strata: list[_StratumFrames], thresholds: np.ndarray) -> _StratumPrecision:
    kept = np.zeros((len(strata), len(thresholds)), np.int64)
    answered_kept = np.zeros_like(kept)
    share = np.zeros((len(strata), len(thresholds)))
    for h, stratum in enumerate(strata):
        kept[h] = _above(stratum.allowed, thresholds)
        answered_kept[h] = stratum.yes.count(thresholds)
        yes_kept = stratum.yes.at(thresholds)
        with np.errstate(invalid="ignore", divide="ignore"):
            share[h] = np.where(answered_kept[h] > 0, yes_kept / answered_kept[h], stratum.fallback)
    covered = np.array([stratum.fallback_answers > 0 for stratum in strata], bool)
    return _StratumPrecision(kept, answered_kept, share, covered)


def _weighed(block: _StratumPrecision) -> np.ndarray:
    """Per threshold: the answered strata's kept frames weighted by their shares of yes, over
    those frames (NaN where they keep none)."""
    kept = block.kept[block.covered]
    total = kept.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, (kept * block.share[block.covered]).sum(axis=0) / total, np.nan)


def _precisions(answers: Answers, thresholds: np.ndarray) -> np.ndarray:
    """The estimated precision at each threshold (NaN where the answered strata keep no frame
    of the project), THRESHOLD_BLOCK thresholds at a time: a project of millions of frames has
    as many."""
    strata, found = _strata_frames(answers), []
    for start in range(0, len(thresholds), THRESHOLD_BLOCK):
        found.append(
            _weighed(_stratum_precision(strata, thresholds[start : start + THRESHOLD_BLOCK]))
        )
    return np.concatenate(found) if found else np.zeros(0)


def _smoothed_spread(share, answers):
    """The binomial spread of a stratum's share of yes among `answers` answers, with half a yes
    and half a no added: answers that agree do not make a stratum certain."""
    return (share * answers + 0.5) * (answers - share * answers + 0.5) / (answers + 1) ** 2


def _precision(answers: Answers, threshold: float) -> tuple[float, tuple[float, float]]:
    """The estimated precision at `threshold` and its interval (module docstring)."""
    strata = _strata_frames(answers)
    block = _stratum_precision(strata, np.array([threshold]))
    kept, answered_kept = block.kept[:, 0], block.answered_kept[:, 0]
    share, covered = block.share[:, 0], block.covered
    precision = float(_weighed(block)[0])
    if math.isnan(precision):
        return math.nan, (0.0, 1.0)
    total = int(kept[covered].sum())
    census, variance, used = True, 0.0, 0
    below, above = 0.0, 0.0  # how far the frames kept without an answer among them may move it
    for h in np.flatnonzero(covered & (kept > 0)):
        if answered_kept[h] >= kept[h]:
            used += answered_kept[h]
            continue  # every frame it keeps was answered
        census = False
        if answered_kept[h]:
            n, correction = answered_kept[h], 1 - answered_kept[h] / kept[h]
        else:  # its share comes from answered frames it does not keep: no correction
            n, correction = strata[h].fallback_answers, 1.0
            below += kept[h] / total * share[h]
            above += kept[h] / total * (1 - share[h])
        used += n
        variance += (kept[h] / total) ** 2 * _smoothed_spread(share[h], n) * correction / n
    if census:  # every kept frame of every stratum answered: no sampling error
        return precision, (precision, precision)
    low, high = wilson(precision, _effective_size(precision, variance, used))
    return precision, (max(0.0, low - below), min(1.0, high + above))


def estimate(answers: Answers, threshold: float) -> Estimate:
    """Precision and recall at `threshold` (kept: score above it, strictly, as the rule says)."""
    kept = answers.rule_allows & (answers.score.astype(np.float32) > np.float32(threshold))
    precision, precision_interval = _precision(answers, threshold)
    recall, recall_interval = _ratio(answers, answers.yes & kept, answers.yes)
    return Estimate(
        threshold,
        precision,
        precision_interval,
        recall,
        recall_interval,
    )


def _recalls(answers: Answers, thresholds: np.ndarray) -> np.ndarray:
    """The estimated recall at each threshold (NaN where no answer is yes)."""
    w = answers.weights
    yes = answers.yes & answers.rule_allows
    total = float(np.sum(w * answers.yes))
    if total == 0:
        return np.full(len(thresholds), np.nan)
    return _SumsAbove.of(answers.score[yes], w[yes]).at(thresholds) / total


def candidate_thresholds(answers: Answers) -> np.ndarray:
    """The thresholds between which the estimates change: 0, then one between each two
    consecutive distinct scores of the frames the rest of the rule allows, near the middle of
    them and written with few decimals."""
    scores = np.unique(answers.allowed_scores.astype(np.float32))
    return np.concatenate([[0.0], _between(scores[:-1], scores[1:])])


def _between(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The midpoints of (low, high), each rounded to the fewest decimals that keep a frame
    scored `low` out and one scored `high` in (the rule compares in float32, strictly), or `low`
    itself where eight decimals cannot."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    middle = (low + high) / 2
    chosen = middle.copy()
    undecided = np.ones(len(middle), bool)
    for decimals in range(2, 9):
        t = np.round(middle, decimals)
        fits = undecided & (low.astype(np.float32) <= t.astype(np.float32))
        fits &= t.astype(np.float32) < high.astype(np.float32)
        chosen[fits] = t[fits]
        undecided &= ~fits
    chosen[undecided] = low[undecided]  # too close for 8 decimals: `low` itself keeps it out
    return chosen


@dataclass(frozen=True)
class Choice:
    estimate: Estimate | None  # None: no threshold reaches the precision asked for
    goal: str  # what was asked: "precision >= 0.95" or "best F1"


def choose_threshold(answers: Answers, precision: float | None = None) -> Choice:
    """With `precision`: the lowest threshold whose estimated precision reaches it (the most
    recall at that precision). Without: the threshold of the best F1 (the lowest of equals)."""
    thresholds = candidate_thresholds(answers)
    precisions = _precisions(answers, thresholds)
    if precision is None:
        recalls = _recalls(answers, thresholds)
        with np.errstate(invalid="ignore"):
            f1 = np.nan_to_num(2 * precisions * recalls / (precisions + recalls))
        best = int(np.argmax(f1))  # the first of equals: the lowest threshold
        found = estimate(answers, float(thresholds[best])) if f1[best] > 0 else None
        return Choice(found, "best F1")
    lowest = _lowest_reaching(precisions, precision)
    found = estimate(answers, float(thresholds[lowest])) if lowest is not None else None
    return Choice(found, f"precision >= {precision:g}")


def _lowest_reaching(precisions: np.ndarray, precision: float) -> int | None:
    """The position of the first (lowest) threshold whose precision reaches `precision`."""
    reaching = np.flatnonzero(precisions >= precision)  # NaN never reaches
    return int(reaching[0]) if len(reaching) else None


@dataclass(frozen=True)
class Aim:
    """The threshold that frames added to a sample are aimed at."""

    threshold: float
    recommended: bool  # False: no threshold reaches the precision asked; the nearest to it


def aim_more(answers: Answers, precision: float | None = None) -> Aim | None:
    """Where frames added to the sample should narrow the estimate: the threshold that
    `choose_threshold` recommends, or where no threshold reaches `precision`, the one of the
    highest estimated precision (the lowest of equals), where it comes nearest. None where the
    answers recommend nothing to aim at (none yet, or no yes for the best F1)."""
    if not len(answers.yes):
        return None
    if precision is None:
        found = choose_threshold(answers).estimate
        return Aim(found.threshold, recommended=True) if found is not None else None
    thresholds = candidate_thresholds(answers)
    precisions = _precisions(answers, thresholds)
    lowest = _lowest_reaching(precisions, precision)
    if lowest is not None:
        return Aim(float(thresholds[lowest]), recommended=True)
    if np.isnan(precisions).all():
        return None
    return Aim(float(thresholds[int(np.nanargmax(precisions))]), recommended=False)


def report_thresholds(answers: Answers, count: int, also: Sequence[float] = ()) -> list[float]:
    """Thresholds for a table of `count` rows evenly over the logit of the answered scores, and
    the thresholds in `also` (the config's, the chosen one)."""
    x = logit(answers.score)
    grid = 1.0 / (1.0 + np.exp(-np.linspace(x.min(), x.max(), count))) if len(x) else []
    return sorted({round(float(t), 4) for t in grid} | {float(t) for t in also})
