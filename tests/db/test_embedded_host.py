"""One host per embedded PostgreSQL (db/embedded_host.py): a home on shared storage that a second
machine uses is refused there, with the holder named, instead of a second server starting on the
same files; this host's lock of a process that is gone is taken over.

The first host is a process with a hostname of its own (a UTS namespace, `unshare -u`): the same
kernel, so its server's pid is one this process could look up, which is exactly what made the
second start join or take over that server before there was a lock."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy.engine import make_url

from dataminer_dagster.cli import main
from dataminer_dagster.core.process_liveness import process_space
from dataminer_dagster.db.embedded_host import HOST_LOCK, EmbeddedServerInUse
from dataminer_dagster.db.server import claims_database_url, stop_embedded
from dataminer_dagster.settings import load_settings

_OTHER_HOST = "machine-a"


@pytest.fixture
def home(monkeypatch) -> Iterator[Path]:
    """A DATAMINER_HOME of its own, for the embedded server."""
    # Not under pytest's tmp dir, which another session may lock (see conftest.py).
    home = Path(tempfile.mkdtemp(prefix="dataminer-test-host-"))
    monkeypatch.setenv("DATAMINER_HOME", str(home))
    for name in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield home
    (home / HOST_LOCK).unlink(missing_ok=True)  # a server a failed test left running: ours now
    stop_embedded(load_settings())
    shutil.rmtree(home, ignore_errors=True)


def _as_host(hostname: str, code: str) -> subprocess.CompletedProcess:
    """Run Python `code` in a process whose hostname is `hostname` (its own UTS namespace)."""
    return subprocess.run(
        ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$1" -c "$2"']
        + [hostname, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=120,
    )


_START = """
import psycopg
from sqlalchemy.engine import make_url
from dataminer_dagster.db.server import claims_database_url
from dataminer_dagster.settings import load_settings

url = make_url(claims_database_url(load_settings())).set(drivername="postgresql")
with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
    print(conn.execute("SELECT 42").fetchone()[0])
"""
_STOP = """
from dataminer_dagster.db.server import stop_embedded
from dataminer_dagster.settings import load_settings

print(stop_embedded(load_settings()))
"""


def _lock(home: Path) -> dict:
    return json.loads((home / HOST_LOCK).read_text())


def _postmaster_pid() -> int:
    return int((load_settings().embedded_pgdata / "postmaster.pid").read_text().split()[0])


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="a process with a hostname of its own needs unshare(1) and root",
)
def test_a_second_host_on_one_embedded_data_directory_is_refused_with_the_holder_named(home):
    started = _as_host(_OTHER_HOST, _START)
    assert started.returncode == 0 and started.stdout.strip() == "42", started.stderr[-3000:]
    server_pid = _postmaster_pid()
    assert _lock(home)["host"] == _OTHER_HOST and _lock(home)["pid"] == server_pid
    try:
        with pytest.raises(EmbeddedServerInUse) as refused:
            claims_database_url(load_settings())
        message = str(refused.value)
        assert f"is in use by host {_OTHER_HOST} (pid {server_pid}," in message
        assert "DATAMINER_DATABASE_URL" in message and str(home / HOST_LOCK) in message

        said = CliRunner().invoke(main, ["db", "url"])
        assert said.exit_code != 0
        assert said.output == f"Error: {message}\n", said.output  # one line, no traceback

        with pytest.raises(EmbeddedServerInUse, match=f"in use by host {_OTHER_HOST}"):
            stop_embedded(load_settings())  # `dataminer db stop`: that host's server to stop
        assert _postmaster_pid() == server_pid and psutil.pid_exists(server_pid)
        assert _lock(home)["host"] == _OTHER_HOST, "another host's lock is never given up here"
    finally:
        stopped = _as_host(_OTHER_HOST, _STOP)
    assert stopped.stdout.strip() == "stopped", stopped.stderr[-3000:]
    assert not (home / HOST_LOCK).exists(), "the holder's `db stop` gives the lock back"


def test_another_hosts_lock_is_not_taken_over_even_with_no_server_running_here(home):
    """The lock as another machine writes it (its hostname, its boot id): that host may be cut
    off while its server still writes, so nothing here is touched."""
    lock = {
        "host": _OTHER_HOST,
        "space": f"{uuid.uuid4()} pid:[4026531836]",
        "pid": 4242,
        "started": time.time() - 3600,
        "since": "2026-12-05T06:00:00+00:00",
    }
    (home / HOST_LOCK).write_text(json.dumps(lock) + "\n")
    with pytest.raises(EmbeddedServerInUse, match=f"is in use by host {_OTHER_HOST} \\(pid 4242,"):
        claims_database_url(load_settings())
    assert _lock(home) == lock
    assert not any(load_settings().embedded_pgdata.glob("*")), "no server was set up here"


@pytest.mark.parametrize("left_by", ["a process that exited", "an earlier boot"])
def test_this_hosts_stale_lock_is_taken_over(home, left_by):
    if left_by == "a process that exited":
        process = subprocess.Popen(["true"])
        started = time.time()
        process.wait()
        pid, space = process.pid, process_space()
    else:  # this very process, but as a pid of another boot of the machine
        pid, started, space = os.getpid(), time.time(), f"{uuid.uuid4()} pid:[4026531836]"
    stale = {
        "host": socket.gethostname(),
        "space": space,
        "pid": pid,
        "started": started,
        "since": "2026-12-05T06:00:00+00:00",
    }
    (home / HOST_LOCK).write_text(json.dumps(stale) + "\n")

    url = make_url(claims_database_url(load_settings())).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
        assert conn.execute("SELECT 42").fetchone() == (42,)
    taken = _lock(home)
    assert taken["host"] == socket.gethostname() and taken["space"] == process_space()
    assert taken["pid"] == _postmaster_pid(), "the lock names the server it guards"

    assert stop_embedded(load_settings()) == "stopped"
    assert not (home / HOST_LOCK).exists(), "`db stop` gives the lock back"
