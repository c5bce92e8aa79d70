"""The embedded PostgreSQL comes back after a crash: the lock files that its killed processes left
behind, half written or naming a PID that another process now has, do not keep it down."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dataminer_dagster.db.server import stop_embedded
from dataminer_dagster.settings import load_settings

# A fresh process, as after a restart: each process starts the server at most once.
_QUERY = """
import psycopg
from sqlalchemy.engine import make_url
from dataminer_dagster.db.server import claims_database_url
from dataminer_dagster.settings import load_settings

url = make_url(claims_database_url(load_settings())).set(drivername="postgresql")
with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
    print(conn.execute("SELECT 42").fetchone()[0])
"""


def _query_in_new_process() -> str:
    done = subprocess.run([sys.executable, "-c", _QUERY], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture
def pgdata(monkeypatch) -> Iterator[Path]:
    """The data directory of an embedded server, running, in a DATAMINER_HOME of its own."""
    # Not under pytest's tmp dir, which another session may lock (see conftest.py).
    home = Path(tempfile.mkdtemp(prefix="dataminer-test-crash-"))
    monkeypatch.setenv("DATAMINER_HOME", str(home))
    for name in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert _query_in_new_process() == "42"
    yield load_settings().embedded_pgdata
    stop_embedded(load_settings())
    shutil.rmtree(home, ignore_errors=True)


def _crash(pgdata: Path) -> list[str]:
    """Kill the server and its children at once, as a power cut would; the lines of its
    postmaster.pid, which stays."""
    lines = (pgdata / "postmaster.pid").read_text().splitlines()
    postmaster = psutil.Process(int(lines[0]))
    processes = [postmaster, *postmaster.children()]
    for process in processes:
        process.kill()
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive
    return lines


def test_a_crashed_server_whose_pid_another_process_now_has_starts_again(pgdata):
    _crash(pgdata)
    # the server's user, so that PostgreSQL itself, not only this project, takes the PID as alive
    stranger = subprocess.Popen(["sleep", "300"], user=pgdata.stat().st_uid)
    try:
        for lock_file in (pgdata / "postmaster.pid", pgdata / ".s.PGSQL.5432.lock"):
            rest = lock_file.read_text().splitlines()[1:]
            lock_file.write_text("\n".join([str(stranger.pid), *rest]) + "\n")

        assert _query_in_new_process() == "42"
        assert int((pgdata / "postmaster.pid").read_text().split()[0]) != stranger.pid
        assert stranger.poll() is None, "the process with the old PID was left alone"
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.parametrize("kept_lines", [0, 5], ids=["empty", "first-five-lines"])
def test_a_server_killed_while_writing_its_pid_file_starts_again(pgdata, kept_lines):
    """PostgreSQL writes the first five lines of postmaster.pid at once and the rest later."""
    lines = _crash(pgdata)
    (pgdata / "postmaster.pid").write_text("".join(f"{line}\n" for line in lines[:kept_lines]))

    assert not stop_embedded(load_settings())
    assert _query_in_new_process() == "42"


def test_a_server_whose_fast_shutdown_hangs_is_stopped_immediately_and_comes_back(
    pgdata, monkeypatch
):
    """A backend that cannot end (stopped by a signal here) holds a fast shutdown for ever:
    `stop_embedded` then stops the server immediately, says so, and the next start recovers."""
    import os
    import signal

    import psycopg
    from sqlalchemy.engine import make_url

    from dataminer_dagster.db import server
    from dataminer_dagster.db.server import claims_database_url

    monkeypatch.setattr(server, "FAST_STOP_S", 2)
    url = make_url(claims_database_url(load_settings())).set(drivername="postgresql")
    session = psycopg.connect(url.render_as_string(hide_password=False))
    backend = session.info.backend_pid
    os.kill(backend, signal.SIGSTOP)
    try:
        how = stop_embedded(load_settings())
    finally:
        if psutil.pid_exists(backend):
            os.kill(backend, signal.SIGCONT)
    assert how is not None and how.startswith("stopped immediately"), how
    assert server._running_postmaster(pgdata) is None
    assert _query_in_new_process() == "42"
