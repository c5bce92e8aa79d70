"""One host per embedded PostgreSQL: a home on shared storage is never served by two machines.

PostgreSQL guards its data directory with `postmaster.pid`, which names a pid that only the
machine that wrote it can look up. On another machine sharing the home (NFS), that pid names no
process or some unrelated one, the file looks stale, and a second server would start on the same
files and corrupt them. So the home holds a lock, `pg.host`, naming the host that serves it: its
hostname, its process space (boot id and pid namespace, core/process_liveness.py), and the
process that holds the directory (the server, once started) with its start time.

The lock is created by hard-linking a complete file into place: exclusive on NFS too, and a link
whose reply was lost and retransmitted is recognised by the link count. It is replaced only by one
rename of a complete file, so a reader on any host sees a whole holder or none.

* Another host's lock refuses the start, with a line naming that host and saying to use an
  external PostgreSQL across machines. It is never taken over: a host that seems gone may only be
  cut off while its server still writes. Once it no longer runs the server, its lock is removed
  there (`dataminer db stop`) or by hand.
* This host's lock whose process is gone (the server stopped or crashed, the machine rebooted,
  the container restarted: another boot or pid namespace) is taken over.

Hosts are told apart by hostname, so machines that share a home need distinct hostnames.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from dataminer_dagster.core.process_liveness import process_space

HOST_LOCK = "pg.host"
# A process started this long after the time a lock records holds a reused pid: not the holder.
_START_TOLERANCE_S = 2.0


class EmbeddedServerInUse(RuntimeError):
    """The embedded PostgreSQL's data directory is served by another host."""


@dataclass(frozen=True)
class ServerHost:
    """Who holds an embedded data directory: a host and a process on it."""

    host: str
    space: str | None  # core/process_liveness.process_space() of the holder
    pid: int
    started: float  # the process's start time, seconds since the epoch
    since: str  # when the host took the lock, for people

    def is_this_host(self) -> bool:
        return self.host == socket.gethostname()

    def process_alive(self) -> bool:
        """The holding process still runs: False where its pids are not ours to look up
        (another host, boot or pid namespace: its processes are not this one's to find)."""
        if not self.is_this_host() or self.space != process_space():
            return False
        import psutil

        try:
            process = psutil.Process(self.pid)
            created, status = process.create_time(), process.status()
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True  # another user's process: alive, as far as we may tell
        return status != psutil.STATUS_ZOMBIE and abs(created - self.started) <= _START_TOLERANCE_S


def claim_host(home: Path) -> None:
    """Make this host the holder of `home`'s embedded data directory, or raise
    EmbeddedServerInUse when another host holds it. Call under the home's start-up lock, before
    the data directory is touched."""
    lock = home / HOST_LOCK
    holder = _read(lock)
    if holder is None:
        if _create(lock, _this_process()):
            return
        holder = _read(lock)
        if holder is None:  # taken, and this host's view of the folder has not caught up
            raise EmbeddedServerInUse(
                f"another process has just taken the embedded PostgreSQL of {home} ({lock}); "
                "try again in a moment"
            )
    if not holder.is_this_host():
        raise EmbeddedServerInUse(_in_use_message(home, lock, holder))
    if not holder.process_alive():
        _replace(lock, _this_process())


def refuse_other_host(home: Path) -> None:
    """Raise EmbeddedServerInUse when another host holds `home`'s embedded data directory."""
    lock = home / HOST_LOCK
    holder = _read(lock)
    if holder is not None and not holder.is_this_host():
        raise EmbeddedServerInUse(_in_use_message(home, lock, holder))


def record_server(home: Path, pid: int, started: float) -> None:
    """Name the server (its postmaster's pid and start time) as the holding process, once it runs:
    the lock then lives exactly as long as the server."""
    lock = home / HOST_LOCK
    holder = _read(lock)
    if holder is not None and (holder.pid, holder.started) == (pid, started):
        return
    since = holder.since if holder is not None else _now()
    _replace(lock, ServerHost(socket.gethostname(), process_space(), pid, started, since))


def release_host(home: Path) -> None:
    """Remove the lock if this host holds it and its process is gone (the server was stopped
    here, or died). Call under the home's start-up lock."""
    lock = home / HOST_LOCK
    holder = _read(lock)
    if holder is not None and holder.is_this_host() and not holder.process_alive():
        lock.unlink(missing_ok=True)


def _in_use_message(home: Path, lock: Path, holder: ServerHost) -> str:
    return (
        f"the embedded PostgreSQL of {home} is in use by host {holder.host} (pid {holder.pid}, "
        f"since {holder.since}), and one data directory can be served by one host only: to share "
        "a home across machines, use an external PostgreSQL (set DATAMINER_DATABASE_URL on every "
        f"machine). If {holder.host} no longer runs it, stop it there (dataminer db stop) or "
        f"delete {lock}"
    )


def _this_process() -> ServerHost:
    import psutil

    started = psutil.Process().create_time()
    return ServerHost(socket.gethostname(), process_space(), os.getpid(), started, _now())


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _read(lock: Path) -> ServerHost | None:
    try:
        raw = json.loads(lock.read_text())
        return ServerHost(
            str(raw["host"]),
            raw["space"],
            int(raw["pid"]),
            float(raw["started"]),
            str(raw["since"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise EmbeddedServerInUse(
            f"the embedded PostgreSQL of {lock.parent} is locked by {lock}, which cannot be read "
            f"({error}): if no other host runs that server, delete the file"
        ) from None


def _complete_file(lock: Path, holder: ServerHost) -> Path:
    """A hidden sibling of `lock` holding `holder`, written in full."""
    written = lock.with_name(f".{lock.name}.{uuid.uuid4().hex[:8]}")
    written.write_text(json.dumps(asdict(holder)) + "\n")
    return written


def _create(lock: Path, holder: ServerHost) -> bool:
    """Create `lock` naming `holder` unless it exists; True when this call created it."""
    written = _complete_file(lock, holder)
    try:
        # Exists: someone else's, or ours whose reply was lost; the link count tells.
        with contextlib.suppress(FileExistsError):
            os.link(written, lock)
        return written.stat().st_nlink == 2
    finally:
        written.unlink()


def _replace(lock: Path, holder: ServerHost) -> None:
    os.replace(_complete_file(lock, holder), lock)
