"""Discovery: new catalog rows become Dagster's dynamic partitions, and the catalog is compared
with Dagster now and then so that rows the cursor passed get theirs and deleted rows' partitions
go (engine/planning.py plans the runs; the work sensor and `dataminer run` call both once a
cycle).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.db.partition_rows import (
    PARTITION_SETS,
    existing_keys,
    row_count,
    rows_after,
    rows_before,
)
from dataminer_dagster.db.schema import LARGEST_ID
from dataminer_dagster.engine.stored_partitions import partition_count
from dataminer_dagster.registry import PROJECT_VIDEOS, PROJECTS, VIDEOS

MAX_PARTITION_ADDS_PER_TICK = 25_000
# The catalog is compared with Dagster on a tick that finds nothing new, at most this often: the
# number of rows of each set (kept by triggers, db/delta_counts.py) against the number of
# partitions Dagster holds (kept by the instance storage's triggers where it is ours). Where they
# differ, the keys of that set are compared on the side that has more (its rows, or Dagster's
# partitions), newest first, until the counts agree: a row the cursor passed (ids are taken at
# insert, not at commit) is among the newest. A difference that such a comparison read to its end
# without explaining (a count that drifted) sets off no other until it changes. A pass over every
# key of both sides is made FULL_COMPARE_EVERY_S apart whatever the counts say, for the rare pair
# of changes that leaves them equal (a row the cursor passed and a partition whose row was
# deleted, both within COMPARE_EVERY_S); a comparison set off by counts goes before it.
COMPARE_EVERY_S = 30.0
FULL_COMPARE_EVERY_S = 3600.0
# A comparison reads the keys in chunks for about COMPARE_STEP_S a tick (at least one chunk), each
# key looked up on the other side by its index, its progress kept in the cursor, so that it
# survives whatever process runs the next tick (bench/README.md, "Scale": the pass over every key
# of 1,000,000 videos).
COMPARE_STEP_S = 0.1
COMPARE_CHUNK_KEYS = 2_500
# The sides of a set: its catalog rows (has each a partition?), Dagster's partitions (has each
# still its row?).
ROWS, PARTITIONS = "rows", "partitions"


@dataclass
class DiscoveryCursor:
    project: int = 0
    video: int = 0
    project_video: int = 0
    compared_at: float = 0.0  # when the counts were last compared (epoch)
    full_compared_at: float = 0.0  # when the last pass over every key ended
    # A comparison under way, else None: {"sides": [[partitions name, ROWS or PARTITIONS], ...]
    # left to read, "before": where the first goes on (a catalog id, or Dagster's page cursor)}.
    comparing: dict | None = None  # ... of the sides whose counts differ
    full_pass: dict | None = None  # ... of every key
    # {partitions name: rows - partitions} that a comparison read to its end without explaining
    unexplained: dict[str, int] = field(default_factory=dict)
    # {project: digest of the config versions last reported} (engine/config_versions.py)
    configs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str | None) -> DiscoveryCursor:
        """A cursor as `dump` wrote it; fields another version wrote or left out are ignored or
        take their defaults (the sensor's cursor outlives an upgrade and a downgrade)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known}) if raw else cls()

    def dump(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class Discovery:
    additions: dict[str, list[str]] = field(default_factory=dict)  # partitions def name -> new keys
    removals: dict[str, list[str]] = field(default_factory=dict)  # ... -> keys whose row is gone
    cursor: DiscoveryCursor = field(default_factory=DiscoveryCursor)

    @property
    def count(self) -> int:
        return sum(len(keys) for keys in self.additions.values())

    def add(self, instance: dg.DagsterInstance) -> None:
        """Add the new partitions, in bulk: one `add_dynamic_partitions` per partition set (at
        most MAX_PARTITION_ADDS_PER_TICK keys a cycle). The planning cycle does this itself,
        before it plans runs over them (engine/planning.py, plan_cycle), rather than return
        AddDynamicPartitionsRequests, which the sensor daemon applies key by key
        (a `has_dynamic_partition` query per key) and logs whole: far slower (bench/README.md,
        discovery). Adding is idempotent (existing keys are skipped), so a tick that
        fails after it only adds them again; the cursor moves with the tick's result."""
        for name, keys in self.additions.items():
            instance.add_dynamic_partitions(name, keys)

    def removal_requests(
        self, partitions: Mapping[str, dg.DynamicPartitionsDefinition]
    ) -> list[dg.DeleteDynamicPartitionsRequest]:
        """The partitions of deleted rows, for the sensor daemon to remove (rare: deletions)."""
        return [partitions[name].build_delete_request(keys) for name, keys in self.removals.items()]

    def remove(self, instance: dg.DagsterInstance) -> None:
        """Remove the partitions of deleted rows here, for callers that drive runs themselves."""
        for name, keys in self.removals.items():
            for key in keys:
                instance.delete_dynamic_partition(name, key)

    def apply(self, instance: dg.DagsterInstance) -> None:
        self.add(instance)
        self.remove(instance)


# The cursor field of each partition set's rows.
_CURSOR_FIELDS = {PROJECTS: "project", VIDEOS: "video", PROJECT_VIDEOS: "project_video"}


def plan_discovery(
    engine: sa.Engine,
    cursor: DiscoveryCursor,
    budget: int = MAX_PARTITION_ADDS_PER_TICK,
    *,
    instance: dg.DagsterInstance | None = None,
) -> Discovery:
    """New catalog rows become partitions: projects, videos, project videos (in that order, in
    discovery order, at most `budget` per call).

    The cursor (the last id seen) finds new rows cheaply, but ids are taken when rows are
    inserted, not when their transactions commit: a row committed after a row with a higher id
    (two catalog runs, `add-video` during one) is passed by it. So, with the `instance`, once the
    cursor finds nothing new, the counts of the two are compared (at most every
    `COMPARE_EVERY_S`), and where they differ (or hourly) the keys themselves, a step a cycle:
    rows the cursor passed are added, and partitions whose row was deleted are to be removed."""
    result = Discovery(cursor=replace(cursor))
    with engine.connect() as c:
        for partitions_name in PARTITION_SETS:
            field_name = _CURSOR_FIELDS[partitions_name]
            left = budget - result.count
            if left <= 0:
                break
            rows = rows_after(c, partitions_name, getattr(cursor, field_name), left)
            if rows:
                result.additions[partitions_name] = [r.key for r in rows]
                setattr(result.cursor, field_name, rows[-1].id)
    if instance is None or result.count:
        return result
    now, found = time.time(), result.cursor
    differences = None
    if found.comparing is not None:
        differences = _count_differences(instance, engine)
        found.comparing = _still_differing(found.comparing, differences)
        if found.comparing is None:
            found.unexplained = {}  # the counts agree: what differed was found
    elif now - found.compared_at >= COMPARE_EVERY_S:
        found.compared_at = now
        differences = _count_differences(instance, engine)
        if differences and differences != found.unexplained:
            found.comparing = {"sides": _sides(differences), "before": None}
        elif not differences:
            found.unexplained = {}
        full_due = now - found.full_compared_at >= FULL_COMPARE_EVERY_S
        if found.comparing is None and found.full_pass is None and full_due:
            found.full_pass = {"sides": _sides(), "before": None}
    if found.comparing is not None:
        result.additions, result.removals, found.comparing = _compare_step(
            instance, engine, found.comparing
        )
        if found.comparing is None:  # read to its end: what its findings leave unexplained
            found.unexplained = _left_over(differences, result)
    elif found.full_pass is not None:
        result.additions, result.removals, found.full_pass = _compare_step(
            instance, engine, found.full_pass
        )
        if found.full_pass is None:
            found.full_compared_at = now
    return result


def _count_differences(instance: dg.DagsterInstance, engine: sa.Engine) -> dict[str, int]:
    """{partitions name: rows in the catalog - partitions in Dagster} where they differ."""
    with engine.connect() as c:
        counts = {
            name: row_count(c, name) - partition_count(instance, name) for name in PARTITION_SETS
        }
    return {name: more for name, more in counts.items() if more}


def _sides(differences: Mapping[str, int] | None = None) -> list[list[str]]:
    """The sides to compare: of each set that differs, the one with more keys (its rows, where
    the catalog has more rows than Dagster partitions); without `differences`, every side."""
    if differences is None:
        return [[name, side] for name in PARTITION_SETS for side in (ROWS, PARTITIONS)]
    return [[name, ROWS if more > 0 else PARTITIONS] for name, more in differences.items()]


def _still_differing(progress: dict, differences: Mapping[str, int]) -> dict | None:
    """A comparison of the sides that differed, without those whose counts agree now (what
    differed there was found); None when none is left."""
    sides = [side for side in progress["sides"] if side in _sides(differences)]
    if not sides:
        return None
    before = progress["before"] if sides[0] == progress["sides"][0] else None
    return {**progress, "sides": sides, "before": before}


def _left_over(differences: Mapping[str, int], found: Discovery) -> dict[str, int]:
    """The differences once `found`'s additions and removals are made."""
    left = {
        name: more - len(found.additions.get(name, ())) + len(found.removals.get(name, ()))
        for name, more in differences.items()
    }
    return {name: more for name, more in left.items() if more}


def _compare_step(
    instance: dg.DagsterInstance, engine: sa.Engine, progress: dict
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict | None]:
    """One step of a comparison from where `progress` left off, each side newest first, chunks
    of COMPARE_CHUNK_KEYS for about COMPARE_STEP_S: (rows without a partition, partitions whose
    row is gone, by partitions name, oldest first; the progress after it, None at the end).

    Each side is read first and looked up on the other after it, so that a change made
    meanwhile is never taken for a difference: a row is read before Dagster is asked for its
    partition (a row created meanwhile is not read); a partition is read before the catalog is
    asked for its row (a row created meanwhile is found). What changes behind the step is the
    next comparison's to find. Adding is idempotent."""
    missing: dict[str, list[str]] = {}
    gone: dict[str, list[str]] = {}
    sides, before = [list(side) for side in progress["sides"]], progress["before"]
    started, chunks = time.monotonic(), 0
    with engine.connect() as c:
        while sides and (not chunks or time.monotonic() - started < COMPARE_STEP_S):
            name, side = sides[0]
            if side == ROWS:
                rows = rows_before(
                    c, name, LARGEST_ID if before is None else before, COMPARE_CHUNK_KEYS
                )
                keys = [row.key for row in rows]
                held = instance.get_existing_dynamic_partitions(name, keys) if keys else set()
                more, before = len(rows) == COMPARE_CHUNK_KEYS, rows[-1].id if rows else before
            else:
                page = instance.get_paginated_dynamic_partitions(
                    name, COMPARE_CHUNK_KEYS, False, cursor=before
                )
                keys = list(page.results)
                held = existing_keys(c, name, keys) if keys else set()
                more, before = page.has_more, page.cursor
            chunks += 1
            if differ := [key for key in keys if key not in held]:
                (missing if side == ROWS else gone).setdefault(name, []).extend(differ)
            if not more:
                sides.pop(0)
                before = None
    progress = {**progress, "sides": sides, "before": before}
    return _oldest_first(missing), _oldest_first(gone), progress if sides else None


def _oldest_first(found: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: keys[::-1] for name, keys in found.items()}
