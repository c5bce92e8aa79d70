"""One data directory per database: the database records files by their path relative to one
data directory, so every process that uses it must see that same directory (on one machine, or
shared storage mounted on every machine).

At first use the database records the directory it serves (table `served_data_dir`: a random
marker, the path and the host) and the directory gets the marker in a file of its own
(`DATA_DIR_MARKER`). A process whose data directory lacks that marker, or holds another, is
refused with an error naming both directories: a second machine with its own disk at the same
path is told apart from the shared one too. A data directory marked by another database is taken
over by a database that serves none yet (a database made afresh for old files).
"""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.db.schema import SCHEMA

DATA_DIR_MARKER = ".dataminer-database"

_lock = threading.Lock()
_checked: set[tuple[str, Path]] = set()  # (database URL, data directory) found to match


class DataDirectoryMismatch(RuntimeError):
    """This process's data directory is not the one its database serves."""


def require_served_data_dir(engine: sa.Engine, data_dir: Path) -> None:
    """Record `data_dir` as the one the database serves when it serves none yet; raise
    DataDirectoryMismatch when it serves another. Checked once per process."""
    data_dir = Path(data_dir).absolute()
    key = (engine.url.render_as_string(hide_password=False), data_dir)
    with _lock:
        if key in _checked:
            return
    marker_file = data_dir / DATA_DIR_MARKER
    with engine.begin() as conn:
        # One process records the first data directory; the others wait, then read its marker.
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('served_data_dir'))"))
        served = conn.execute(
            sa.text(f"SELECT marker, path, host FROM {SCHEMA}.served_data_dir")
        ).one_or_none()
        found = marker_file.read_text().strip() if marker_file.is_file() else None
        if served is None:
            marker = found or uuid.uuid4().hex
            conn.execute(
                sa.text(
                    f"INSERT INTO {SCHEMA}.served_data_dir (marker, path, host) "
                    "VALUES (:marker, :path, :host) ON CONFLICT DO NOTHING"
                ),
                {"marker": marker, "path": str(data_dir), "host": socket.gethostname()},
            )
            if found is None:
                data_dir.mkdir(parents=True, exist_ok=True)
                marker_file.write_text(marker + "\n")
        elif found != served.marker:
            raise DataDirectoryMismatch(
                f"the database {engine.url.render_as_string(hide_password=True)} serves the data "
                f"directory {served.path} (recorded by host {served.host}), but this process's "
                f"data directory is {data_dir} on host {socket.gethostname()}, which "
                + (
                    f"is not that directory (it has no marker file {DATA_DIR_MARKER})"
                    if found is None
                    else "another database serves"
                )
                + ". Every machine must use the same data directory (shared storage mounted at "
                "the same path; DATAMINER_DATA_DIR), or its own database (DATAMINER_DATABASE_URL)."
            )
    with _lock:
        _checked.add(key)
