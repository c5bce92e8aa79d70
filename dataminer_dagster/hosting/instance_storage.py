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
from dagster import EventLogEntry, Field, StringSource
from dagster_postgres import PostgresEventLogStorage, PostgresRunStorage, PostgresScheduleStorage

from dataminer_dagster.db.delta_counts import read_count
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.schema import LARGEST_ID
from dataminer_dagster.db.server import dagster_database_url
from dataminer_dagster.hosting.described_failures import described
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
        url = _url(config_value)
        # Dagster's storages look for their tables on a new connection whenever one is built, and
        # the code server builds an instance for every sensor evaluation: a large share of each
        # work tick under dagster-daemon (bench/README.md, "Figures behind the code"). Looked for
        # once per process here.
        checked = (cls, url) in _storages_checked
        storage = cls(postgres_url=url, should_autocreate_tables=not checked, inst_data=inst_data)
        _storages_checked.add((cls, url))
        # dagster-postgres opens a new connection for every operation (a NullPool), so that no
        # DagsterInstance holds connections. Here the three storages share the process's pooled
        # autocommit engine for the URL instead (pre-pinged: a database restart costs no failed
        # statement; a forked child gets its own). In `dataminer run`'s loop the storages' own
        # connections were a large share of the run (bench/README.md, "Figures behind the code").
        # dagster-webserver swaps in its own pool the same way (optimize_for_webserver).
        storage._engine = get_engine(storage.postgres_url, autocommit=True)
        return storage


# (storage class, URL) whose tables this process has looked for (and made, where missing).
_storages_checked: set[tuple[type, str]] = set()


class DataminerRunStorage(_UrlFromEnvironment, PostgresRunStorage):
    pass


class DataminerEventLogStorage(_UrlFromEnvironment, PostgresEventLogStorage):
    """Dagster's event log storage, with additions to its table of dynamic partitions for the
    work sensor (engine/discovery.py, engine/stored_partitions.py), made once per database when an
    instance is built:

    * each set's number of keys, kept as deltas by triggers (db/delta_counts.py): the sensor
      compares it with the catalog's rows every 30 s, where a count(*) of a set costs time that
      grows with the set (`dynamic_partition_count`);
    * a (set, id) index, for a run's range and for reading a set page by page (the comparison
      with the catalog does, newest first): Dagster's own read asks for one set's keys past a
      storage id, in id order, and PostgreSQL walks the primary key through every key of every
      other set in between, as it cannot know that the set's keys there are few. Here the read
      asks for the keys between two (set, id) pairs: a range of this index. The same keys,
      pages and cursors;
    * the membership query in one statement per 20,000 keys (Dagster's sends an IN list per
      1,000 keys, a round trip each);
    * new keys added with the keys as one array parameter: Dagster's builds a VALUES row per
      key, which SQLAlchemy compiles anew for every call, most of a discovering tick's time. The
      same statement otherwise: the keys in the order given (Dagster's order is the order they
      were added), those already there skipped.

    And a failure the product described (a `dagster.Failure`: the items that are dead, and why)
    is kept as its description, without the stack Dagster records for it
    (described_failures.py), so that the UI shows the reason alone.

    The figures behind each of these: bench/README.md, "Figures behind the code".
    """

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        storage = super().from_config_value(inst_data, config_value)
        _prepare_partitions_table(storage._engine)
        return storage

    def store_event(self, event: EventLogEntry) -> None:
        dagster_event = event.dagster_event
        if dagster_event is not None:
            event = event._replace(dagster_event=described(dagster_event))
        super().store_event(event)

    def dynamic_partition_count(self, partitions_def_name: str) -> int:
        """How many keys the set holds, from the kept count."""
        if not _prepare_partitions_table(self._engine):
            self._check_partitions_table()  # Dagster's table is missing: Dagster's own error
        with self._engine.connect() as conn:
            return read_count(conn, _PARTITION_COUNTS, "partitions_def_name", partitions_def_name)

    def add_dynamic_partitions(
        self, partitions_def_name: str, partition_keys: Sequence[str]
    ) -> None:
        if not partition_keys:
            return
        self._check_partitions_table()
        with self.index_connection() as conn:
            conn.execute(
                sa.text("""INSERT INTO dynamic_partitions (partitions_def_name, partition)
                           SELECT :name, key
                             FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS given(key, n)
                            ORDER BY n
                               ON CONFLICT DO NOTHING"""),
                {"name": partitions_def_name, "keys": list(partition_keys)},
            )

    def get_existing_dynamic_partitions(
        self, partitions_def_name: str, partition_keys: Sequence[str]
    ) -> set[str]:
        self._check_partitions_table()
        keys, found = list(set(partition_keys)), set()
        with self.index_connection() as conn:
            for start in range(0, len(keys), _MEMBERSHIP_CHUNK):
                found.update(
                    conn.execute(
                        sa.text("""SELECT partition FROM dynamic_partitions
                                    WHERE partitions_def_name = :name
                                      AND partition = ANY(CAST(:keys AS text[]))"""),
                        {
                            "name": partitions_def_name,
                            "keys": keys[start : start + _MEMBERSHIP_CHUNK],
                        },
                    ).scalars()
                )
        return found

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
        high = stored if not ascending and stored is not None else LARGEST_ID
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
_MEMBERSHIP_CHUNK = 20_000
_prepared_databases: set[str] = set()

# The kept counts: their table, the functions of their triggers, the triggers. Made (again, where
# a part is missing: Dagster's table made anew drops its triggers) in one transaction that holds
# off writers of Dagster's table, the counts taken anew, so that they are exact: every key added
# or deleted after is counted by a trigger.
_COUNTING = [
    f"""CREATE TABLE IF NOT EXISTS {_PARTITION_COUNTS} (
            id BIGSERIAL PRIMARY KEY, partitions_def_name TEXT NOT NULL, delta BIGINT NOT NULL)""",
    f"""CREATE INDEX IF NOT EXISTS {_PARTITION_COUNTS}_by_set
            ON {_PARTITION_COUNTS} (partitions_def_name, id)""",
    f"""CREATE OR REPLACE FUNCTION {_PARTITION_COUNTS}_add() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {_PARTITION_COUNTS} (partitions_def_name, delta)
            SELECT partitions_def_name, CASE WHEN TG_OP = 'DELETE' THEN -count(*) ELSE count(*) END
              FROM changed GROUP BY partitions_def_name;
            RETURN NULL;
        EXCEPTION WHEN undefined_table THEN  -- dropped by hand: never in Dagster's way
            RETURN NULL;
        END $$""",
    f"""CREATE OR REPLACE FUNCTION {_PARTITION_COUNTS}_reset() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            TRUNCATE {_PARTITION_COUNTS};
            RETURN NULL;
        EXCEPTION WHEN undefined_table THEN
            RETURN NULL;
        END $$""",
    *(
        statement
        for event, transition in (("INSERT", "NEW"), ("DELETE", "OLD"))
        for statement in (
            f"DROP TRIGGER IF EXISTS {_PARTITION_COUNTS}_{event.lower()} ON dynamic_partitions",
            f"""CREATE TRIGGER {_PARTITION_COUNTS}_{event.lower()} AFTER {event}
                 ON dynamic_partitions REFERENCING {transition} TABLE AS changed
                 FOR EACH STATEMENT EXECUTE FUNCTION {_PARTITION_COUNTS}_add()""",
        )
    ),
    f"DROP TRIGGER IF EXISTS {_PARTITION_COUNTS}_truncate ON dynamic_partitions",
    f"""CREATE TRIGGER {_PARTITION_COUNTS}_truncate AFTER TRUNCATE ON dynamic_partitions
         FOR EACH STATEMENT EXECUTE FUNCTION {_PARTITION_COUNTS}_reset()""",
    f"TRUNCATE {_PARTITION_COUNTS}",
    f"""INSERT INTO {_PARTITION_COUNTS} (partitions_def_name, delta)
        SELECT partitions_def_name, count(*) FROM dynamic_partitions GROUP BY partitions_def_name""",
]


def _counting(c: sa.Connection) -> bool:
    """Whether the counts are kept: their table there, and their three triggers, enabled."""
    triggers = f"""SELECT count(*) FROM pg_trigger
                    WHERE tgrelid = to_regclass('dynamic_partitions') AND tgenabled <> 'D'
                      AND tgname LIKE '{_PARTITION_COUNTS}\\_%'"""
    return _exists(c, _PARTITION_COUNTS) and c.execute(sa.text(triggers)).scalar() == 3


def _exists(c: sa.Connection, relation: str) -> bool:
    return c.execute(sa.text("SELECT to_regclass(:r)"), {"r": relation}).scalar() is not None


def _prepare_partitions_table(engine: sa.Engine) -> bool:
    """Add the (set, id) index and the kept counts to Dagster's dynamic_partitions table, once per
    database and process (looked up first: every process that builds an instance passes here,
    and both lock the table). False while Dagster's table does not exist (looked at again next
    time)."""
    key = engine.url.render_as_string(hide_password=True)
    if key in _prepared_databases:
        return True
    with engine.connect() as c:
        if not _exists(c, "dynamic_partitions"):
            return False
        if not _exists(c, _PARTITIONS_BY_SET):
            # another process may create it at the same moment: then it exists, as wanted
            with contextlib.suppress(sa.exc.IntegrityError):
                c.execute(
                    sa.text(
                        f"CREATE INDEX IF NOT EXISTS {_PARTITIONS_BY_SET}"
                        " ON dynamic_partitions (partitions_def_name, id)"
                    )
                )
        counted = _counting(c)
    if not counted:
        # One transaction (the engine autocommits), holding off writers and any other process
        # making the same (the lock conflicts with itself), readers let on.
        with engine.connect().execution_options(isolation_level="READ COMMITTED") as c, c.begin():
            c.execute(sa.text("LOCK TABLE dynamic_partitions IN SHARE ROW EXCLUSIVE MODE"))
            if not _counting(c):  # not made meanwhile
                for statement in _COUNTING:
                    c.execute(sa.text(statement))
    _prepared_databases.add(key)
    return True


class DataminerScheduleStorage(_UrlFromEnvironment, PostgresScheduleStorage):
    pass
