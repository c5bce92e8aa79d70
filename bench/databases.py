"""A fresh, migrated claim database for one benchmark run: on the server of `--database-url`, or
on an embedded PostgreSQL in the run's temporary folder."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.db import migrate
from dataminer_dagster.db.server import with_driver


def fresh_database(database_url: str | None, tmp: Path, prefix: str) -> tuple[str, str]:
    """(admin URL of the server, URL of a new migrated database named `<prefix>_<random>`)."""
    if database_url:
        admin = with_driver(database_url, "psycopg")
    else:
        from dataminer_dagster.db.server import pgserver_handle

        admin = with_driver(pgserver_handle(tmp / "pg").get_uri("postgres"), "psycopg")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(admin).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(sa.create_engine(url, poolclass=sa.NullPool))
    return admin, url


@contextmanager
def scratch_database(database_url: str | None, prefix: str) -> Iterator[str]:
    """The URL of a `fresh_database`, dropped at the end with its temporary folder."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    admin, url = fresh_database(database_url, tmp, prefix)
    try:
        yield url
    finally:
        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()
        name = sa.engine.make_url(url).database
        with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def catalog_home(database_url: str | None, prefix: str) -> Iterator[tuple[str, Path]]:
    """(URL, home): a `scratch_database` and a temporary DAGSTER_HOME holding the repository's
    dagster.yaml, this process's environment pointed at both (Dagster's storage and the claim
    tables then share the database, as `dagster dev` has them)."""
    with (
        scratch_database(database_url, prefix) as url,
        tempfile.TemporaryDirectory(prefix=f"dataminer-{prefix}-") as tmp,
    ):
        home = Path(tmp)
        shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", home / "dagster.yaml")
        os.environ.update(DAGSTER_HOME=str(home), DATAMINER_DATABASE_URL=url)
        yield url, home


@contextmanager
def scratch_home(database_url: str | None, prefix: str) -> Iterator[Path]:
    """A new folder (kept, to look at afterwards) holding a DATAMINER_HOME and a data directory,
    over a `scratch_database`, this process's environment pointed at all three."""
    root = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    with scratch_database(database_url, prefix.replace("-", "_")) as url:
        os.environ.update(
            DATAMINER_HOME=str(root / "home"),
            DATAMINER_DATA_DIR=str(root / "data"),
            DATAMINER_DATABASE_URL=url,
        )
        yield root
