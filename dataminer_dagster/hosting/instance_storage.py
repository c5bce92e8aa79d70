"""Dagster instance storage on PostgreSQL: the embedded server by default, or an external one.

dagster.yaml names these classes. Each process that builds the instance (webserver, daemon, run
workers, CLI) resolves the URL itself: $DATAMINER_DAGSTER_DATABASE_URL, else
$DATAMINER_DATABASE_URL, else the embedded server under $DATAMINER_HOME (started or joined here).
Dagster's tables go to the `public` schema; ours live in the `dataminer` schema.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import sqlalchemy as sa
from dagster import Field, StringSource
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from dataminer_dagster.db.delta_counts import read_count
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
    """Dagster's event log storage, with two additions to its table of dynamic partitions for the
    work sensor, made once per database when an instance is built:

    * each set's number of keys, kept as deltas by triggers (db/delta_counts.py): the sensor
      compares it with the catalog's rows every 30 s, and a count(*) of a set of 1,000,000
      keys takes 80-90 ms (`dynamic_partition_count`);
    * a (set, id) index, for the read of a set's keys after a storage id (the key-by-key
      comparison reads each set page by page) and for a run's range (engine/stored_partitions.py).

    Dagster's own read asks for one set's keys `WHERE id > cursor ORDER BY id`: PostgreSQL walks
    the primary key from the cursor through every later key of every other set (after a bulk
    discovery the videos' cursor lies before a million project videos: 105-165 ms a read, every
    tick, at 1,000,000 videos), as it cannot know that the set's keys after the cursor are few.
    Here the read asks for the keys between two (set, id) pairs, in (set, id) order: a range of an
    index this storage adds beside Dagster's own. The same keys, pages and cursors."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        storage = super().from_config_value(inst_data, config_value)
        _prepare_partitions_table(storage._engine)
        return storage

    def dynamic_partition_count(self, partitions_def_name: str) -> int:
        """How many keys the set holds, from the kept count (counted where the table that keeps
        it is not made yet: Dagster's tables were created after this instance was built)."""
        if not _prepare_partitions_table(self._engine):
            with self.index_connection() as conn:
                return conn.execute(
                    sa.text(
                        "SELECT count(*) FROM dynamic_partitions WHERE partitions_def_name = :n"
                    ),
                    {"n": partitions_def_name},
                ).scalar_one()
        with self._engine.connect() as conn:
            return read_count(conn, _PARTITION_COUNTS, "partitions_def_name", partitions_def_name)

    def get_existing_dynamic_partitions(
        self, partitions_def_name: str, partition_keys: Sequence[str]
    ) -> set[str]:
        """Dagster's membership query in one statement, the keys as one array against its unique
        (set, key) index, where Dagster sends an IN list per 1,000 keys (the key-by-key
        comparison asks about 10,000 keys a step: bench/README.md, "Scale")."""
        self._check_partitions_table()
        with self.index_connection() as conn:
            return set(
                conn.execute(
                    sa.text("""SELECT partition FROM dynamic_partitions
                                WHERE partitions_def_name = :name
                                  AND partition = ANY(CAST(:keys AS text[]))"""),
                    {"name": partitions_def_name, "keys": list(set(partition_keys))},
                ).scalars()
            )

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
_PARTITION_COUNTS = "dataminer_dynamic_partition_counts"
_NO_ID_ABOVE = 2**63 - 1
_prepared_databases: set[str] = set()

# Made in one transaction that holds off writers of the table, so that the first count is exact:
# every key added or deleted after it is counted by a trigger.
_COUNTING = [
    f"""CREATE TABLE {_PARTITION_COUNTS} (
            id BIGSERIAL PRIMARY KEY, partitions_def_name TEXT NOT NULL, delta BIGINT NOT NULL)""",
    f"CREATE INDEX {_PARTITION_COUNTS}_by_set ON {_PARTITION_COUNTS} (partitions_def_name, id)",
    f"""CREATE FUNCTION {_PARTITION_COUNTS}_add() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {_PARTITION_COUNTS} (partitions_def_name, delta)
            SELECT partitions_def_name, CASE WHEN TG_OP = 'DELETE' THEN -count(*) ELSE count(*) END
              FROM changed GROUP BY partitions_def_name;
            RETURN NULL;
        END $$""",
    f"""CREATE FUNCTION {_PARTITION_COUNTS}_reset() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            DELETE FROM {_PARTITION_COUNTS};
            RETURN NULL;
        END $$""",
    *(
        f"""CREATE TRIGGER {_PARTITION_COUNTS}_{event.lower()} AFTER {event} ON dynamic_partitions
             REFERENCING {transition} TABLE AS changed
             FOR EACH STATEMENT EXECUTE FUNCTION {_PARTITION_COUNTS}_add()"""
        for event, transition in (("INSERT", "NEW"), ("DELETE", "OLD"))
    ),
    f"""CREATE TRIGGER {_PARTITION_COUNTS}_truncate AFTER TRUNCATE ON dynamic_partitions
         FOR EACH STATEMENT EXECUTE FUNCTION {_PARTITION_COUNTS}_reset()""",
    f"""INSERT INTO {_PARTITION_COUNTS} (partitions_def_name, delta)
        SELECT partitions_def_name, count(*) FROM dynamic_partitions GROUP BY partitions_def_name""",
]


def _prepare_partitions_table(engine: sa.Engine) -> bool:
    """Add the (set, id) index and the kept counts to Dagster's dynamic_partitions table, once per
    database (looked up first: every process that builds an instance passes here, and both lock
    the table). False while Dagster's table does not exist (looked at again next time)."""
    key = engine.url.render_as_string(hide_password=True)
    if key in _prepared_databases:
        return True
    exists = sa.text("SELECT to_regclass(:name)")
    with engine.connect() as c:
        if not c.execute(exists, {"name": "dynamic_partitions"}).scalar():
            return False
        if not c.execute(exists, {"name": _PARTITIONS_BY_SET}).scalar():
            # another process may create it at the same moment: then it exists, as wanted
            with contextlib.suppress(sa.exc.IntegrityError):
                c.execute(
                    sa.text(
                        f"CREATE INDEX IF NOT EXISTS {_PARTITIONS_BY_SET}"
                        " ON dynamic_partitions (partitions_def_name, id)"
                    )
                )
        counted = c.execute(exists, {"name": _PARTITION_COUNTS}).scalar()
    if not counted:
        # One transaction (the engine autocommits), holding off writers and any other process
        # making the same (the lock conflicts with itself), readers let on.
        with engine.connect().execution_options(isolation_level="READ COMMITTED") as c, c.begin():
            c.execute(sa.text("LOCK TABLE dynamic_partitions IN SHARE ROW EXCLUSIVE MODE"))
            if not c.execute(exists, {"name": _PARTITION_COUNTS}).scalar():  # made meanwhile?
                for statement in _COUNTING:
                    c.execute(sa.text(statement))
    _prepared_databases.add(key)
    return True


class DataminerScheduleStorage(_UrlFromEnvironment, PostgresScheduleStorage):
    pass
