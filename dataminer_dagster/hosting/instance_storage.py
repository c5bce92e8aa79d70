"""Dagster instance storage on PostgreSQL: the embedded server by default, or an external one.

dagster.yaml names these classes. Each process that builds the instance (webserver, daemon, run
workers, CLI) resolves the URL itself: $DATAMINER_DAGSTER_DATABASE_URL, else
$DATAMINER_DATABASE_URL, else the embedded server under $DATAMINER_HOME (started or joined here).
Dagster's tables go to the `public` schema; ours live in the `dataminer` schema.
"""

from __future__ import annotations

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
    pass


class DataminerScheduleStorage(_UrlFromEnvironment, PostgresScheduleStorage):
    pass
