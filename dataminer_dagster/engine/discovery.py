"""Discovery: new catalog rows become Dagster's dynamic partitions (and deleted rows' partitions
go), and Dagster's order of each partition set, kept between ticks so that planning runs over
tight ranges costs what changed (engine/planning.py plans the runs; the work sensor and `dataminer
run` call both once a cycle).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.db.partition_rows import PARTITION_SETS, all_keys, row_count, rows_after
from dataminer_dagster.engine.registry import PROJECT_VIDEOS, PROJECTS, VIDEOS

MAX_PARTITION_ADDS_PER_TICK = 25_000
# The catalog is compared with Dagster on a tick that finds nothing new, at most this often: the
# number of rows of each set (kept by triggers, db/partition_rows.py) against the number of
# partitions Dagster holds (the planner's kept order). Only where they differ are the keys
# themselves compared, which reads them all (18 s at 1,000,000 videos: bench/README.md, "Scale");
# that full pass is also made FULL_COMPARE_EVERY_S apart whatever the counts say, for the rare
# pair of changes that leaves them equal (a row the cursor passed and a partition whose row was
# deleted, both within COMPARE_EVERY_S).
COMPARE_EVERY_S = 30.0
FULL_COMPARE_EVERY_S = 3600.0


@dataclass
class DiscoveryCursor:
    project: int = 0
    video: int = 0
    project_video: int = 0
    compared_at: float = 0.0  # when the catalog was last compared with Dagster (epoch)
    full_compared_at: float = 0.0  # ... key by key
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
        most MAX_PARTITION_ADDS_PER_TICK keys a cycle). The work sensor does this itself rather
        than return AddDynamicPartitionsRequests, which the sensor daemon applies key by key
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

    def apply(self, instance: dg.DagsterInstance) -> None:
        """Additions and removals at once, for callers that drive runs themselves."""
        self.add(instance)
        for name, keys in self.removals.items():
            for key in keys:
                instance.delete_dynamic_partition(name, key)


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
    cursor finds nothing new (and at most every `COMPARE_EVERY_S`), the catalog's keys are
    compared with Dagster's: rows the cursor passed are added, and partitions whose row was
    deleted are to be removed."""
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
    now = time.time()
    if instance is not None and not result.count and now - cursor.compared_at >= COMPARE_EVERY_S:
        full_due = now - cursor.full_compared_at >= FULL_COMPARE_EVERY_S
        if full_due or not _counts_agree(instance, engine):
            listed, result.additions, result.removals = _compare_with_dagster(
                instance, engine, budget
            )
            result.cursor.full_compared_at = now
            for name in PARTITION_SETS:  # the kept order: Dagster's keys and this cycle's
                known = _known_order(instance, name, result)
                with _KNOWN_ORDERS_LOCK:  # keys deleted by other hands (the UI) are forgotten
                    known.keep_only({*listed[name], *result.additions.get(name, ())})
        result.cursor.compared_at = now
    return result


def _counts_agree(instance: dg.DagsterInstance, engine: sa.Engine) -> bool:
    """Each set has as many rows in the catalog as partitions in Dagster (the kept order, read
    from where it was left: it costs what changed)."""
    with engine.connect() as c:
        return all(
            row_count(c, name) == len(_known_order(instance, name, Discovery()).positions)
            for name in PARTITION_SETS
        )


def _compare_with_dagster(
    instance: dg.DagsterInstance, engine: sa.Engine, budget: int
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """(Dagster's keys; rows without a partition, at most `budget` in id order; partitions
    whose row is gone), by partitions name. Dagster's keys are read before the catalog's, so
    that a row created meanwhile can only be missing from the first list (and is added: adding
    is idempotent), never wrongly pruned."""
    listed = {name: instance.get_dynamic_partitions(name) for name in PARTITION_SETS}
    missed: dict[str, list[str]] = {}
    gone: dict[str, list[str]] = {}
    with engine.connect() as c:
        for name in PARTITION_SETS:
            current = all_keys(c, name)
            known, present = set(listed[name]), set(current)
            left = budget - sum(len(keys) for keys in missed.values())
            if left > 0 and (keys := [k for k in current if k not in known][:left]):
                missed[name] = keys
            if keys := [k for k in listed[name] if k not in present]:
                gone[name] = keys
    return listed, missed, gone


# --- Dagster's order of each partition set -------------------------------------------------------


# Dagster's order of each partition set is kept between ticks in the process that plans (the code
# server under the daemon, `dataminer run`'s own): a tick reads only the keys added since the last
# one (Dagster's storage-id cursor), so a quiet tick costs what changed, not the catalog's size. It
# is read whole again at most this often; keys deleted by other hands are forgotten sooner, by
# the comparison with the catalog that their missing count sets off (plan_discovery).
ORDER_REREAD_EVERY_S = 3600.0
_ORDER_PAGE = 50_000


@dataclass
class _KnownOrder:
    """Dagster's order of one partition set as last read: its keys (positions in that list; a key
    forgotten keeps its place, unused) and where the next read starts."""

    keys: list[str] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    cursor: str | None = None
    read_at: float = field(default_factory=time.monotonic)

    def append(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key not in self.positions:
                self.positions[key] = len(self.keys)
                self.keys.append(key)

    def read_new(self, instance: dg.DagsterInstance, name: str) -> None:
        while True:
            page = instance.get_paginated_dynamic_partitions(
                name, limit=_ORDER_PAGE, ascending=True, cursor=self.cursor
            )
            self.append(page.results)
            self.cursor = page.cursor
            if not page.has_more:
                return

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.positions.pop(key, None)

    def keep_only(self, present: set[str]) -> None:
        self.forget([key for key in self.positions if key not in present])


_KNOWN_ORDERS: dict[tuple[str, str], _KnownOrder] = {}
_KNOWN_ORDERS_LOCK = threading.Lock()


def _known_order(instance: dg.DagsterInstance, name: str, discovery: Discovery) -> _KnownOrder:
    """The order of partition set `name` on `instance`, brought up to date: the keys Dagster added
    since the last read, then this cycle's discovery (its keys added last, its removals gone)."""
    from dagster._serdes import serialize_value

    try:
        identity = serialize_value(instance.get_ref())  # a new instance object each tick
    except dg.DagsterInvariantViolationError:  # an ephemeral instance: nothing to keep
        identity = None
    with _KNOWN_ORDERS_LOCK:
        known = _KNOWN_ORDERS.get((identity, name)) if identity else None
        if known is None or time.monotonic() - known.read_at > ORDER_REREAD_EVERY_S:
            known = _KnownOrder()
            if identity:
                _KNOWN_ORDERS[identity, name] = known
        known.read_new(instance, name)
        known.forget(discovery.removals.get(name, ()))
        known.append(discovery.additions.get(name, ()))
    return known


@dataclass
class PartitionOrders:
    """Dagster's order of each partition set, as it will be once this cycle's discovery is
    applied: the keys being added last, those being removed gone."""

    instance: dg.DagsterInstance
    discovery: Discovery
    _orders: dict[str, _KnownOrder] = field(default_factory=dict)

    def known(self, name: str) -> _KnownOrder:
        if name not in self._orders:
            self._orders[name] = _known_order(self.instance, name, self.discovery)
        return self._orders[name]

    def __getitem__(self, name: str) -> Mapping[str, int]:
        return self.known(name).positions
