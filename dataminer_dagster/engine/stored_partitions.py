"""Dagster's dynamic partition sets as its storage holds them, looked up by key: the order of some
keys, the keys a run's range covers, how many keys a set has. Each costs what it is asked about,
not the set's size, and nothing is kept between calls, so any process (a code server the daemon
replaced a moment ago, `dataminer run`) plans from the first tick as cheaply as from the hundredth.

Dagster orders a dynamic partition set by the storage id each key was given when it was added
(`get_dynamic_partitions` reads them `ORDER BY id`; a run's partition range is the keys between
its two ends in that order), so the id is the position. Dagster's public interface reads a set
whole or page by page from its start; the lookups by key below are made on its storage's table,
as Dagster's own SQL storages (SQLite, PostgreSQL) define it. An instance whose event log is kept
elsewhere (Dagster+) is read whole, once per lane and planning cycle, and counted whole.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import dagster as dg
import sqlalchemy as sa

# Keys per statement when they are looked up (Dagster's own membership query uses 1,000).
_LOOKUP_CHUNK = 1000


class PartitionOrder:
    """Dagster's order of one partition set, as it will be once the keys being removed in this
    planning cycle (`removed`) are gone: storage ids as positions."""

    def __init__(self, instance: dg.DagsterInstance, name: str, removed: Collection[str] = ()):
        self.instance, self.name, self.removed = instance, name, set(removed)
        self._listed: dict[str, int] | None = None

    def positions(self, keys: Iterable[str]) -> dict[str, int]:
        """The position of each of `keys` that the set holds."""
        wanted = [k for k in dict.fromkeys(keys) if k not in self.removed]
        if not wanted:
            return {}
        storage = _sql_storage(self.instance)
        if storage is None:
            listed = self._listed_positions()
            return {k: listed[k] for k in wanted if k in listed}
        from dagster._core.storage.event_log.schema import DynamicPartitionsTable as T

        found: dict[str, int] = {}
        with storage.index_connection() as conn:
            for start in range(0, len(wanted), _LOOKUP_CHUNK):
                chunk = wanted[start : start + _LOOKUP_CHUNK]
                rows = conn.execute(
                    sa.select(T.c.partition, T.c.id).where(
                        T.c.partitions_def_name == self.name, T.c.partition.in_(chunk)
                    )
                )
                found.update((partition, position) for partition, position in rows)
        return found

    def between(self, first: str, last: str) -> dict[str, int]:
        """The keys from `first` to `last` in the set's order (a run's partition range) with
        their positions; none when either end is not in the set."""
        ends = self.positions([first, last])
        if len(ends) < len({first, last}):
            return {}
        low, high = ends[first], ends[last]
        storage = _sql_storage(self.instance)
        if storage is None:
            listed = self._listed_positions()
            return {k: p for k, p in listed.items() if low <= p <= high and k not in self.removed}
        from dagster._core.storage.event_log.schema import DynamicPartitionsTable as T

        with storage.index_connection() as conn:
            rows = conn.execute(
                sa.select(T.c.partition, T.c.id).where(
                    T.c.partitions_def_name == self.name, T.c.id.between(low, high)
                )
            )
            return {k: p for k, p in rows if k not in self.removed}

    def _listed_positions(self) -> dict[str, int]:
        if self._listed is None:
            keys = self.instance.get_dynamic_partitions(self.name)
            self._listed = {key: position for position, key in enumerate(keys)}
        return self._listed


def partition_count(instance: dg.DagsterInstance, name: str) -> int:
    """How many keys the set holds: from the storage's kept count where it keeps one
    (hosting/instance_storage.py, `dynamic_partition_count`), else counted."""
    storage = instance.event_log_storage
    kept = getattr(storage, "dynamic_partition_count", None)
    if kept is not None:
        return kept(name)
    if _sql_storage(instance) is None:
        return len(instance.get_dynamic_partitions(name))
    from dagster._core.storage.event_log.schema import DynamicPartitionsTable as T

    with storage.index_connection() as conn:
        query = sa.select(sa.func.count()).where(T.c.partitions_def_name == name)
        return int(conn.execute(query).scalar_one())


def _sql_storage(instance: dg.DagsterInstance):
    """The instance's event log storage where it is one of Dagster's SQL storages, else None."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    storage = instance.event_log_storage
    return storage if isinstance(storage, SqlEventLogStorage) else None
