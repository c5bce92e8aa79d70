"""Spending downloads where frames are kept: which new videos a project with a target takes next.

A project with `target.images` acquires in rounds. Each round lists its sources deeper (more
results per query, more entries per listing) and takes at most a round's worth of the videos it
has not seen, chosen one at a time by an upper confidence bound (UCB1) on each source's yield:

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

Without a target every new video is taken, in list order (the catalog's behaviour).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EXPLORATION = 1.0
FIRST_ROUND = 10  # videos taken while the yield is unknown


@dataclass(frozen=True)
class SourceYield:
    downloaded: int  # videos of the source downloaded so far
    kept: int  # their frames kept by dedup


def round_size(target: int, kept: int, downloaded: int, remaining_videos: int | None) -> int:
    """Videos to take in the next round: what the project's mean yield says the rest of the
    target needs (FIRST_ROUND while no video has kept a frame yet), within the videos the
    budget has left."""
    missing = max(target - kept, 0)
    if missing == 0:
        return 0
    known = downloaded > 0 and kept > 0
    wanted = math.ceil(missing * downloaded / kept) if known else FIRST_ROUND
    return wanted if remaining_videos is None else max(0, min(wanted, remaining_videos))


def choose(
    candidates: Mapping[str, Sequence[str]],
    yields: Mapping[str, SourceYield],
    count: int,
) -> list[str]:
    """Up to `count` video ids from `candidates` ({source: its unseen videos, best first}), by
    the rule of the module's docstring; ties go to the source listed first."""
    order = list(candidates)
    left = {source: list(videos) for source, videos in candidates.items()}
    picked_from = dict.fromkeys(order, 0)
    known = [yields[s] for s in yields]
    total_downloaded = sum(y.downloaded for y in known)
    total_kept = sum(y.kept for y in known)
    prior = total_kept / total_downloaded if total_downloaded else 1.0
    bonus_scale = EXPLORATION * max(prior, 1e-9)
    chosen: list[str] = []
    seen: set[str] = set()
    while len(chosen) < count:
        best, best_score = None, -math.inf
        for source in order:
            if not left[source]:
                continue
            y = yields.get(source, SourceYield(0, 0))
            n = y.downloaded + picked_from[source]
            mean = (y.kept + prior) / (y.downloaded + 1)
            score = mean + bonus_scale * math.sqrt(
                math.log(total_downloaded + len(chosen) + 1) / (n + 1)
            )
            if y.downloaded + picked_from[source] == 0:
                score = math.inf  # never tried: first
            if score > best_score:
                best, best_score = source, score
        if best is None:
            break
        video = left[best].pop(0)
        if video not in seen:  # found by two sources: counted for the first that offers it
            seen.add(video)
            chosen.append(video)
        picked_from[best] += 1
    return chosen


def in_list_order(candidates: Mapping[str, Sequence[str]], count: int) -> list[str]:
    """The first `count` videos, source by source in the order they are listed."""
    chosen = dict.fromkeys(video for videos in candidates.values() for video in videos)
    return list(chosen)[:count]
