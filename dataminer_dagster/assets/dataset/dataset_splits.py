"""Train / val / test splits by source.

The frames of one video are near-duplicates of each other, so a split by frame puts one scene in
train and in val and inflates every metric measured on val. So splits are assigned to *source
units*: the connected components of the videos under the links that say two videos show the same
thing (a near-duplicate group with frames of both, a copy of the same content), and a unit goes
whole to one split.

The assignment takes the units in a seeded order (a hash of the seed and the unit's first video
id: the order of the input changes nothing) and gives each to the split that is least full for
its share once it holds the unit. A split with a share above 0 that is still empty then takes the
smallest unit of the split with the most units, so that every split has images whenever there are
at least as many units as splits with a share; with fewer, the empty splits are named in the
warnings, never an error.
"""

from __future__ import annotations

import hashlib
import numbers
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class SplitAssignment:
    split_of: dict[str, str]  # video id -> split, for every video with images
    images: dict[str, int]  # split -> images, every split of SPLITS
    units: dict[str, int]  # split -> source units
    warnings: tuple[str, ...]  # what a person should know: empty splits, and why


def source_units(videos: Iterable[str], links: Iterable[tuple[str, str]]) -> list[tuple[str, ...]]:
    """The connected components of `videos` and the videos `links` join, each sorted, in the
    order of their first video id."""
    parent: dict[str, str] = {}

    def root(v: str) -> str:
        parent.setdefault(v, v)
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for v in videos:
        root(v)
    for a, b in links:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict[str, list[str]] = defaultdict(list)
    for v in parent:
        members[root(v)].append(v)
    return sorted(tuple(sorted(m)) for m in members.values())


def grouped(group: Hashable) -> bool:
    """Whether a frame is in a near-duplicate group: the dedup table marks a frame it could not
    read with a negative group (a NumPy integer when read from the table)."""
    return not (isinstance(group, numbers.Real) and group < 0)


def shared_group_links(rows: Iterable[tuple[str, Hashable]]) -> list[tuple[str, str]]:
    """Links between the videos whose frames share a near-duplicate group; `rows`: (video id,
    group) per frame, a negative group meaning none (a frame that could not be read)."""
    first: dict[Hashable, str] = {}
    links = set()
    for video, group in rows:
        if not grouped(group):
            continue
        other = first.setdefault(group, video)
        if other != video:
            links.add((other, video))
    return sorted(links)


def assign_splits(
    images_per_video: Mapping[str, int],
    links: Iterable[tuple[str, str]],
    ratios: Mapping[str, float],
    seed: int,
) -> SplitAssignment:
    """Each video with images to a split of SPLITS, its source unit (its links' connected
    component) whole; `ratios`: each split's share of the images."""
    shares = {s: float(ratios.get(s, 0.0)) for s in SPLITS}
    wanted = [s for s in SPLITS if shares[s] > 0]
    if not wanted:
        raise ValueError("at least one split needs a share above 0")
    units = [
        u
        for u in source_units(images_per_video, links)
        if sum(images_per_video.get(v, 0) for v in u)
    ]
    size = {u: sum(images_per_video.get(v, 0) for v in u) for u in units}
    total = sum(size.values())
    members: dict[str, list[tuple[str, ...]]] = {s: [] for s in SPLITS}
    filled = dict.fromkeys(SPLITS, 0)
    for unit in sorted(units, key=lambda u: _order_key(seed, u[0])):
        split = min(wanted, key=lambda s: (filled[s] + size[unit]) / (shares[s] * total))
        members[split].append(unit)
        filled[split] += size[unit]
    for split in wanted:
        donors = [s for s in wanted if len(members[s]) > 1]
        if members[split] or not donors:
            continue
        donor = max(donors, key=lambda s: (len(members[s]), filled[s]))
        unit = min(members[donor], key=lambda u: (size[u], _order_key(seed, u[0])))
        members[donor].remove(unit)
        members[split].append(unit)
        filled[donor] -= size[unit]
        filled[split] += size[unit]
    split_of = {
        v: s for s in SPLITS for u in members[s] for v in u if images_per_video.get(v, 0) > 0
    }
    return SplitAssignment(
        split_of=split_of,
        images=filled,
        units={s: len(members[s]) for s in SPLITS},
        warnings=tuple(_warnings(filled, shares, len(units))),
    )


def _order_key(seed: int, first_video: str) -> bytes:
    return hashlib.blake2b(f"{seed}\0{first_video}".encode(), digest_size=8).digest()


def _warnings(filled: dict[str, int], shares: dict[str, float], units: int) -> list[str]:
    empty = [s for s in SPLITS if shares[s] > 0 and not filled[s]]
    if not empty:
        return []
    wanted = sum(1 for s in SPLITS if shares[s] > 0)
    names = " and ".join(empty)
    return [
        f"the {names} split{'s are' if len(empty) > 1 else ' is'} empty: the dataset has "
        f"{units} source unit{'' if units == 1 else 's'} (a video with its copies and the "
        f"videos it shares near-duplicates with) for {wanted} splits; add videos, or set "
        + " and ".join(f"dataset.splits.{s}" for s in empty)
        + " to 0"
    ]


def pairs_across_splits(rows: Iterable[tuple[str, Hashable]], split_of: Mapping[str, str]) -> int:
    """Pairs of frames in one near-duplicate group whose videos are in different splits;
    `rows`: (video id, group) per frame. Frames of a video without a split (none of its frames
    is in the dataset) are left out, as are negative groups."""
    per_group: dict[Hashable, Counter] = defaultdict(Counter)
    for video, group in rows:
        if not grouped(group) or video not in split_of:
            continue
        per_group[group][split_of[video]] += 1
    pairs = 0
    for counts in per_group.values():
        n = sum(counts.values())
        pairs += (n * n - sum(c * c for c in counts.values())) // 2
    return pairs
