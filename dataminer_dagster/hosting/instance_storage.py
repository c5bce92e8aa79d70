"""Dagster instance storage on PostgreSQL: the embedded server by default, or an external one.

dagster.yaml names these classes. Each process that builds the instance (webserver, daemon, run
workers, CLI) resolves the URL itself: $DATAMINER_DAGSTER_DATABASE_URL, else
$DATAMINER_DATABASE_URL, else the embedded server under $DATAMINER_HOME (started or joined here).
Dagster's tables go to the `public` schema; ours live in the `dataminer` schema.
"""

from __future__ import annotations

import contextlib

import sqlalchemy as sa
from dagster import Field, StringSource
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.server import dagster_database_url
from dataminer_dagster.settings import load_settings

_CONFIG = {
    "postgres_url": Field(
        StringSource, is_required=False, description="Overrides the environment."
    ),
}


def _url(config_value: dict) -> str:
    return config_value.get("postgres_url") or dagster_database_url(load_settings())


class _UrlFromEnvironment:
    """Config-driven construction for the three Postgres storages: the URL is resolved here."""

    @classmethod
    def config_type(cls):
        return _CONFIG

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        storage = cls(postgres_url=_url(config_value), inst_data=inst_data)
        # dagster-postgres opens a new connection for every operation (a NullPool), so that no
        # DagsterInstance holds connections. Here the three storages share the process's pooled
        # autocommit engine for the URL instead (pre-pinged: a database restart costs no failed
        # statement; a forked child gets its own). In `dataminer run`'s loop the storages' own
        # connections were a large share of the run (bench/README.md, "Figures behind the code").
        # dagster-webserver swaps in its own pool the same way (optimize_for_webserver).
        storage._engine = get_engine(storage.postgres_url, autocommit=True)
        return storage


class DataminerRunStorage(_UrlFromEnvironment, PostgresRunStorage):
    pass


class DataminerEventLogStorage(_UrlFromEnvironment, PostgresEventLogStorage):
    """Dagster's event log storage, with the read of a partition set's keys after a storage id
    made a range of an index (the work sensor's planner reads each set's new keys every tick).

    Dagster's own read asks for one set's keys `WHERE id > cursor ORDER BY id`: PostgreSQL walks
    the primary key from the cursor through every later key of every other set (after a bulk
    discovery the videos' cursor lies before a million project videos: 105-165 ms a read, every
    tick, at 1,000,000 videos), as it cannot know that the set's keys after the cursor are few.
    Here the read asks for the keys between two (set, id) pairs, in (set, id) order: a range of an
    index this storage adds beside Dagster's own. The same keys, pages and cursors."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        storage = super().from_config_value(inst_data, config_value)
        _index_partitions_by_set(storage._engine)
        return storage

    def get_paginated_dynamic_partitions(
        self, partitions_def_name: str, limit: int, ascending: bool, cursor: str | None = None
    ):
        from dagster._core.types.pagination import PaginatedResults, StorageIdCursor

        self._check_partitions_table()
        # The set's keys strictly between two (set, id) pairs: both ends are where the index's
        # range starts and stops (an equality on the set beside them let PostgreSQL start at the
        # set's first key instead).
        stored = StorageIdCursor.from_cursor(cursor).storage_id if cursor else None
        low = stored if ascending and stored is not None else -1
        high = stored if not ascending and stored is not None else _NO_ID_ABOVE
        direction = "ASC" if ascending else "DESC"
        with self.index_connection() as conn:
            rows = conn.execute(
                sa.text(f"""SELECT id, partition FROM dynamic_partitions
                             WHERE (partitions_def_name, id) > (:name, :low)
                               AND (partitions_def_name, id) < (:name, :high)
                             ORDER BY partitions_def_name {direction}, id {direction}
                             LIMIT :fetch"""),
                {"name": partitions_def_name, "low": low, "high": high, "fetch": limit + 1},
            ).all()
        page = rows[:limit]
        if page:
            next_cursor = StorageIdCursor(storage_id=page[-1].id).to_string()
        else:
            next_cursor = cursor or StorageIdCursor(storage_id=-1).to_string()
        return PaginatedResults(
            results=[row.partition for row in page], cursor=next_cursor, has_more=len(rows) > limit
        )


_PARTITIONS_BY_SET = "dataminer_dynamic_partitions_by_set"
_NO_ID_ABOVE = 2**63 - 1
_indexed_databases: set[str] = set()


def _index_partitions_by_set(engine: sa.Engine) -> None:
    """Add the (set, id) index to Dagster's dynamic_partitions table, once per database (looked
    up first: every process that builds an instance passes here, and creating an index locks
    the table)."""
    key = engine.url.render_as_string(hide_password=True)
    if key in _indexed_databases:
        return
    exists = sa.text("SELECT to_regclass(:name)")
    with engine.connect() as c:
        if not c.execute(exists, {"name": "dynamic_partitions"}).scalar():
            return  # Dagster's tables are not created here (yet): looked at again next time
        if not c.execute(exists, {"name": _PARTITIONS_BY_SET}).scalar():
            # another process may create it at the same moment: then it exists, as wanted
            with contextlib.suppress(sa.exc.IntegrityError):
                c.execute(
                    sa.text(
                        f"CREATE INDEX IF NOT EXISTS {_PARTITIONS_BY_SET}"
                        " ON dynamic_partitions (partitions_def_name, id)"
                    )
                )
    _indexed_databases.add(key)


class DataminerScheduleStorage(_UrlFromEnvironment, PostgresScheduleStorage):
    pass
