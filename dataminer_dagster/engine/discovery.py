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

from dataminer_dagster.db.partition_rows import (
    PARTITION_SETS,
    keys_with_rows,
    row_count,
    rows_after,
)
from dataminer_dagster.engine.registry import PROJECT_VIDEOS, PROJECTS, VIDEOS

MAX_PARTITION_ADDS_PER_TICK = 25_000
# The catalog is compared with Dagster on a tick that finds nothing new, at most this often: the
# number of rows of each set (kept by triggers, db/partition_rows.py) against the number of
# partitions Dagster holds (the planner's kept order). Only where they differ are the keys
# themselves compared; that comparison is also made FULL_COMPARE_EVERY_S apart whatever the counts
# say, for the rare pair of changes that leaves them equal (a row the cursor passed and a
# partition whose row was deleted, both within COMPARE_EVERY_S).
COMPARE_EVERY_S = 30.0
FULL_COMPARE_EVERY_S = 3600.0
# Comparing keys reads every key of both sides: 18 s at 1,000,000 videos in one go (bench/README.md,
# "Scale"). Where the order is kept, it is made in steps of this many keys, one step per tick that
# finds nothing new, so that no tick pays for the whole catalog.
COMPARE_STEP = 25_000


@dataclass
class DiscoveryCursor:
    project: int = 0
    video: int = 0
    project_video: int = 0
    compared_at: float = 0.0  # when the catalog was last compared with Dagster (epoch)
    full_compared_at: float = 0.0  # when the last key-by-key comparison ended
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
    compared with Dagster's (COMPARE_STEP keys a tick): rows the cursor passed are added, and
    partitions whose row was deleted are to be removed."""
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
    if instance is not None and not result.count:
        _compare(instance, engine, cursor, result, budget)
    return result


def _compare(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    cursor: DiscoveryCursor,
    result: Discovery,
    budget: int,
) -> None:
    """On a tick that found nothing new: a step of the key-by-key comparison under way, or, when
    the counts are due and differ (or the last comparison ended FULL_COMPARE_EVERY_S ago), a new
    comparison's first step. Rows without a partition go to `result.additions`, partitions
    whose row is gone to `result.removals`. An instance whose order is not kept (an ephemeral
    one) is compared whole at once."""
    now = time.time()
    identity = _identity(instance)
    with _KNOWN_ORDERS_LOCK:
        comparison = _COMPARISONS.get(identity) if identity else None
    if comparison is None and now - cursor.compared_at >= COMPARE_EVERY_S:
        result.cursor.compared_at = now
        if now - cursor.full_compared_at >= FULL_COMPARE_EVERY_S or not _counts_agree(
            instance, engine
        ):
            comparison = _Comparison()
            if identity:
                with _KNOWN_ORDERS_LOCK:
                    _COMPARISONS[identity] = comparison
    if comparison is None or not comparison.busy.acquire(blocking=False):
        return  # none due, or a tick the daemon gave up on is still stepping it
    try:
        with engine.connect() as c:  # COMPARE_STEP keys a tick where the order is kept; else all
            handled = 0
            while not comparison.done:
                limit = min(
                    COMPARE_STEP - handled if identity else COMPARE_STEP, budget - result.count
                )
                if limit <= 0:
                    break
                kept = _KNOWN_ORDERS.get((identity, comparison.sets[0])) if identity else None
                handled += comparison.step(instance, c, result, limit, kept)
    finally:
        comparison.busy.release()
    with _KNOWN_ORDERS_LOCK:  # the sets compared: Dagster's order as just read is kept
        for name, order in comparison.compared.items():
            if identity:
                _KNOWN_ORDERS[identity, name] = order
        comparison.compared.clear()
        if comparison.done:
            result.cursor.full_compared_at = now
            _COMPARISONS.pop(identity, None)


def _counts_agree(instance: dg.DagsterInstance, engine: sa.Engine) -> bool:
    """Each set has as many rows in the catalog as partitions in Dagster (the kept order, read
    from where it was left: it costs what changed)."""
    with engine.connect() as c:
        return all(
            row_count(c, name) == len(_known_order(instance, name, Discovery()).positions)
            for name in PARTITION_SETS
        )


# The steps of comparing one partition set (_Comparison).
READ_DAGSTER, READ_CATALOG, FIND_GONE = "read Dagster's keys", "read the catalog's", "find gone"


@dataclass
class _Comparison:
    """A key-by-key comparison of the catalog with Dagster, set by set, in steps: Dagster's keys
    page by page (into a fresh order), then the catalog's rows in id order (rows without a
    partition are added), then the fresh order from memory (partitions whose row was not seen
    and has no row now are removed). Dagster's keys are read before the catalog's, so a row
    created meanwhile can only be missing from Dagster's keys (and is added: adding is
    idempotent, and keys the kept order gained since Dagster's were read are left out); a
    partition is removed only if its row is gone when the removal is decided."""

    orders: dict[str, _KnownOrder] = field(default_factory=dict)  # Dagster's, read again
    compared: dict[str, _KnownOrder] = field(default_factory=dict)  # ... of sets compared since
    sets: list[str] = field(default_factory=lambda: list(PARTITION_SETS))  # left to compare
    phase: str = READ_DAGSTER  # of the first set left
    kept_since: int = 0  # the kept order's length when Dagster's keys were read
    after: int = 0  # the last catalog row read
    rows: set[str] = field(default_factory=set)  # the catalog keys read
    checked: int = 0  # Dagster keys checked against them
    busy: threading.Lock = field(default_factory=threading.Lock)

    @property
    def done(self) -> bool:
        return not self.sets

    def step(
        self,
        instance: dg.DagsterInstance,
        conn: sa.Connection,
        result: Discovery,
        limit: int,
        kept: _KnownOrder | None,
    ) -> int:
        """The next step of the first set left, over at most `limit` keys (`limit` more
        additions fit in this cycle); how many keys it handled (at least 1). `kept`: the set's
        kept order, if any."""
        name = self.sets[0]
        order = self.orders.setdefault(name, _KnownOrder())
        if self.phase == READ_DAGSTER:
            before = len(order.keys)
            if not order.read_page(instance, name, limit):
                self.phase, self.kept_since = READ_CATALOG, len(kept.keys) if kept else 0
            return max(len(order.keys) - before, 1)
        if self.phase == READ_CATALOG:
            rows = rows_after(conn, name, self.after, limit)
            self.rows.update(row.key for row in rows)
            since = kept.positions if kept else {}
            if missed := [
                row.key
                for row in rows
                if row.key not in order.positions and since.get(row.key, -1) < self.kept_since
            ]:
                result.additions.setdefault(name, []).extend(missed)
            if len(rows) < limit:
                self.phase = FIND_GONE
            else:
                self.after = rows[-1].id
            return max(len(rows), 1)
        end = min(self.checked + limit, len(order.keys))
        unseen = [k for k in order.keys[self.checked : end] if k in order.positions]
        unseen = [k for k in unseen if k not in self.rows]
        if gone := sorted(set(unseen) - keys_with_rows(conn, name, unseen)) if unseen else []:
            result.removals.setdefault(name, []).extend(gone)
            order.forget(gone)
        handled, self.checked = max(end - self.checked, 1), end
        if end == len(order.keys):
            self.compared[name] = self.orders.pop(name)
            self.sets.pop(0)
            self.phase, self.after, self.rows, self.checked = READ_DAGSTER, 0, set(), 0
        return handled


# --- Dagster's order of each partition set -------------------------------------------------------


# Dagster's order of each partition set is kept between ticks in the process that plans (the code
# server under the daemon, `dataminer run`'s own): a tick reads only the keys added since the last
# one (Dagster's storage-id cursor), so a quiet tick costs what changed, not the catalog's size.
# Each key-by-key comparison with the catalog (_Comparison: at least every FULL_COMPARE_EVERY_S,
# sooner when the counts differ, as when keys were deleted by other hands) reads it again whole,
# in steps, and replaces it.
_ORDER_PAGE = 50_000


@dataclass
class _KnownOrder:
    """Dagster's order of one partition set as last read: its keys (positions in that list; a key
    forgotten keeps its place, unused) and where the next read starts."""

    keys: list[str] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    cursor: str | None = None

    def append(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key not in self.positions:
                self.positions[key] = len(self.keys)
                self.keys.append(key)

    def read_new(self, instance: dg.DagsterInstance, name: str) -> None:
        while self.read_page(instance, name, _ORDER_PAGE):
            pass

    def read_page(self, instance: dg.DagsterInstance, name: str, limit: int) -> bool:
        """Read up to `limit` more keys; whether there are more to read."""
        page = instance.get_paginated_dynamic_partitions(
            name, limit=limit, ascending=True, cursor=self.cursor
        )
        self.append(page.results)
        self.cursor = page.cursor
        return page.has_more

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.positions.pop(key, None)


# By instance (its serialised ref): the kept orders, by partition set, and the comparison under
# way.
_KNOWN_ORDERS: dict[tuple[str, str], _KnownOrder] = {}
_COMPARISONS: dict[str, _Comparison] = {}
_KNOWN_ORDERS_LOCK = threading.Lock()


def _identity(instance: dg.DagsterInstance) -> str | None:
    """What identifies `instance` between ticks (each tick has a new instance object); None for an
    ephemeral instance, whose order is not kept."""
    from dagster._serdes import serialize_value

    return None if instance.is_ephemeral else serialize_value(instance.get_ref())


def _known_order(instance: dg.DagsterInstance, name: str, discovery: Discovery) -> _KnownOrder:
    """The order of partition set `name` on `instance`, brought up to date: the keys Dagster added
    since the last read, then this cycle's discovery (its keys added last, its removals gone)."""
    identity = _identity(instance)
    with _KNOWN_ORDERS_LOCK:
        known = _KNOWN_ORDERS.get((identity, name)) if identity else None
        if known is None:
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
