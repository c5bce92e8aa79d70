"""Spending downloads where frames are kept: which new videos a project with a target takes next.

A project with `target.images` acquires in rounds. Each round lists its sources deeper (twice as
many results per query and entries per listing as the round before) and takes, of the videos it
has not seen, as many as are expected to make up what the target still misses (at most half of
them, so that the next round still has a choice), chosen one at a time by an upper confidence
bound (UCB1) on each source's yield:

    score(source) = mean kept frames per downloaded video + c * sqrt(ln(T + 1) / (n + 1))

where n is what the source has downloaded so far (counting the picks of this round), T the
project's downloads, and the mean is shrunk towards the project's mean by one video's weight (so
one lucky video does not decide). A source never tried has the largest bonus: every source is
tried early (exploration), and then the downloads go mostly to the sources whose videos keep
frames (exploitation). The bonus is scaled by the project's mean yield (c = EXPLORATION times
it), so it is in the units of the yields it is added to. Why this rule: downloads are the scarce
resource (a YouTube client gets a few hundred an hour), yields differ by orders of magnitude
between queries, and UCB1 needs no tuning beyond one constant and never stops exploring a source
whose few tries were unlucky.

Without a target every new video is taken, in list order (the catalog's behaviour); with
`target.order: listed` a round takes them in list order by the same count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EXPLORATION = 1.0
FIRST_ROUND = 10  # videos taken while no video has kept a frame
MAX_DEPTH = 1000  # results per query, entries per listing: a round lists no deeper


@dataclass(frozen=True)
class SourceYield:
    downloaded: int  # videos of the source downloaded so far
    kept: int  # their frames kept by dedup


def choose(
    candidates: Mapping[str, Sequence[str]],
    yields: Mapping[str, SourceYield],
    *,
    need: int,
    limit: int | None = None,
    by_yield: bool = True,
) -> list[str]:
    """The videos of this round from `candidates` ({source: its unseen videos, best first}):
    picked one at a time by the rule of the module's docstring (`by_yield`; otherwise in the
    order the sources are listed) until the picks are expected to keep `need` more frames (each
    counted at its source's mean so far; FIRST_ROUND picks while no video kept a frame), at
    most `limit` (the budget's videos) and at most half the candidates, so that a round always
    leaves a choice to the next one. Ties go to the source listed first."""
    order = list(candidates)
    left = {source: list(videos) for source, videos in candidates.items()}
    unseen = len({video for videos in candidates.values() for video in videos})
    cap = min(math.ceil(unseen / 2), unseen if limit is None else limit)
    picked_from = dict.fromkeys(order, 0)
    total_downloaded = sum(y.downloaded for y in yields.values())
    total_kept = sum(y.kept for y in yields.values())
    known = total_kept > 0
    prior = total_kept / total_downloaded if known else 1.0
    bonus_scale = EXPLORATION * prior
    chosen: list[str] = []
    expected = 0.0
    while len(chosen) < cap and (expected < need if known else len(chosen) < FIRST_ROUND):
        best, best_score = None, -math.inf
        for source in order:
            if not left[source]:
                continue
            y = yields.get(source, SourceYield(0, 0))
            n = y.downloaded + picked_from[source]
            score = (y.kept + prior) / (y.downloaded + 1) + bonus_scale * math.sqrt(
                math.log(total_downloaded + len(chosen) + 1) / (n + 1)
            )
            if n == 0:
                score = math.inf  # never tried: first
            if not by_yield:
                score = -order.index(source)
            if score > best_score:
                best, best_score = source, score
        if best is None:
            break
        video = left[best].pop(0)
        picked_from[best] += 1
        if video not in chosen:  # found by two sources: counted for the first that offers it
            chosen.append(video)
            y = yields.get(best, SourceYield(0, 0))
            expected += (y.kept + prior) / (y.downloaded + 1)
    return chosen
