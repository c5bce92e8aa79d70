"""Outages are not deaths: a worker that cannot reach the database waits for it.

A database restarting for an upgrade, a failover, a network cut or a full database disk is no
fault of any run or item. A process that does work (a Dagster run, `dataminer run`) asks to wait
for the database (`waiting_for_the_database`): then every new connection it opens, and every claim
operation its run makes (`wait_out`), retries with exponential back-off (from a fraction of a
second up to a heartbeat) for up to `leases.outage_wait_s`, saying so in one line a minute
("database unreachable since 10:02:13, retrying in 4 s: ..."). Other processes (a CLI command)
and a sensor's tick (`not_waiting_for_the_database`) fail at once, as before: the tick says why
and the next one tries again.

Every outage a process meets is remembered, for each database (`outages_of`), so that the lease
reaper can record the time it could not see the database and judge a run's silence only over
time the database was up (db/run_liveness.py), and so that a run that failed while the database
was away gives its items back uncounted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import sqlalchemy as sa

from dataminer_dagster.core.progress import RepeatedLines, format_seconds
from dataminer_dagster.settings import LeasePolicy

_log = logging.getLogger(__name__)

T = TypeVar("T")

# SQLSTATEs of a server that is going away, coming back or out of room: the admin or a crash
# ended the session (57P01, 57P02), the server is starting up or shutting down (57P03), its disk
# or memory is full (class 53), or the connection itself failed (class 08). And of a session the
# server ended because it sat idle in its transaction for half a lease (25P03, db/engine.py): its
# client was stalled or cut off meanwhile (a loaded machine, a pause, a network cut), which is no
# item's fault, and the transaction was rolled back, so trying again is safe.
_OUTAGE_STATES = ("57P01", "57P02", "57P03", "53", "25P03")
_CONNECTION_CLASS = "08"
# What a lost connection says where the driver has no SQLSTATE for it.
_LOST_CONNECTION = (
    "connection is closed",
    "server closed the connection",
    "connection refused",
    "could not connect",
    "connection failed",
    "connection timeout",
    "timeout expired",
    "no such file or directory",
    "consuming input failed",
    "terminating connection",
    "the database system is",
    "ssl connection has been closed",
    "connection reset",
    "broken pipe",
)


def outage_reason(error: BaseException) -> str | None:
    """The one-line reason when `error` (or an error in its chain) says the database is
    unreachable, restarting or out of disk, or that it ended this session while its client was
    away; None for any other error (a constraint, a timeout on a locked row, a bug): those are
    the work's to handle."""
    import psycopg

    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, psycopg.Error):  # 25P03 is an InternalError, the rest not
            state = getattr(current, "sqlstate", None)
            first = str(current).strip().splitlines()[0] if str(current).strip() else ""
            if state is not None:
                if state.startswith(_OUTAGE_STATES) or state.startswith(_CONNECTION_CLASS):
                    return first or type(current).__name__
            elif isinstance(current, psycopg.OperationalError | psycopg.InterfaceError) and any(
                words in first.lower() for words in _LOST_CONNECTION
            ):
                return first
        pending += [getattr(current, "orig", None), current.__cause__, current.__context__]
    return None


class DatabaseUnreachable(Exception):
    """The database stayed unreachable longer than this process waits for it."""

    def __init__(self, since: datetime, waited_s: float, reason: str):
        super().__init__(
            f"the database has been unreachable since {since:%H:%M:%S} ({format_seconds(waited_s)}"
            f", longer than leases.outage_wait_s): {reason}"
        )


@dataclass
class _Open:
    started: float  # time.monotonic()
    wall: datetime
    reason: str
    said: bool = False  # a line said it: its end is said too


class Outages:
    """The outages this process met on one database: the one going on, how many began, and the
    longest ended one the lease reaper has not recorded yet. Shared by threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._begun = 0
        self._unrecorded: list[float] = []  # lengths (s) of ended outages
        self._lines = RepeatedLines(every_s=60.0)

    def unreachable(self, reason: str) -> _Open:
        """The database could not be used just now; the outage this is part of."""
        with self._lock:
            if self._open is None:
                self._open = _Open(time.monotonic(), datetime.now().astimezone(), reason)
                self._begun += 1
            self._open.reason = reason
            return self._open

    def reachable(self) -> None:
        """The database answered: an outage going on is over."""
        if self._open is None:  # the common case, without the lock
            return
        with self._lock:
            if self._open is None:
                return
            lasted = time.monotonic() - self._open.started
            said, self._open = self._open.said, None
            self._unrecorded.append(lasted)
        if said:
            _log.warning(f"database reachable again after {format_seconds(lasted)}")

    @property
    def going_on(self) -> bool:
        """Whether the database could not be used at the last try, and not since."""
        return self._open is not None

    @property
    def begun(self) -> int:
        """How many outages this process has met (compare two readings: was there one between?)."""
        return self._begun

    def record(self, write: Callable[[float | None], None]) -> None:
        """Record what this process met since the last record: `write(s)` with the longest
        outage's length, or None (a database write, which fails while the database is away).
        Once it went through, the database is reachable: the outage going on is over, and
        what was met is recorded."""
        with self._lock:
            lengths = list(self._unrecorded)
            if self._open is not None:
                lengths.append(time.monotonic() - self._open.started)
        write(max(lengths) if lengths else None)
        self.reachable()
        with self._lock:
            self._unrecorded = []

    def say(self, outage: _Open, retry_in_s: float) -> None:
        # At most once a minute, however many outages: a full disk refuses writes but not reads,
        # so its outage ends at each read that goes through and begins again at the next write.
        line = self._lines.line(
            "unreachable",
            f"database unreachable since {outage.wall:%H:%M:%S}, retrying in "
            f"{retry_in_s:g} s: {outage.reason}",
        )
        if line is not None:
            outage.said = True
            _log.warning(line)


_outages: dict[str, Outages] = {}
_outages_lock = threading.Lock()


def outages_of(url: sa.URL) -> Outages:
    """The outages this process met on the database at `url`."""
    key = url.set(drivername="postgresql").render_as_string(hide_password=True)
    with _outages_lock:
        return _outages.setdefault(key, Outages())


@dataclass(frozen=True)
class Patience:
    """How long to wait for the database, and how often to try it meanwhile."""

    wait_s: float  # in all, from the outage's start
    first_retry_s: float
    most_between_s: float

    @classmethod
    def of(cls, lease: LeasePolicy) -> Patience:
        most = lease.heartbeat_s  # back within a heartbeat of the database, never later
        return cls(lease.outage_wait_s, min(0.5, most), most)


_patience: list[Patience] = []  # the process's, innermost last
_patience_lock = threading.Lock()
_this_thread = threading.local()  # `impatient`: this thread does not wait, whatever the process


@contextmanager
def waiting_for_the_database(lease: LeasePolicy) -> Iterator[None]:
    """While this lasts, this process waits out outages (its new connections, `wait_out`)."""
    patience = Patience.of(lease)
    with _patience_lock:
        _patience.append(patience)
    try:
        yield
    finally:
        with _patience_lock:
            _patience.remove(patience)


@contextmanager
def not_waiting_for_the_database() -> Iterator[None]:
    """While this lasts, this thread does not wait out outages, even in a process that does (a
    sensor's tick in a process that also runs a run: the tick must end within its deadline)."""
    before = getattr(_this_thread, "impatient", False)
    _this_thread.impatient = True
    try:
        yield
    finally:
        _this_thread.impatient = before


def patience() -> Patience | None:
    """How this thread waits for the database now; None: it does not."""
    if getattr(_this_thread, "impatient", False):
        return None
    return _patience[-1] if _patience else None


def wait_out(call: Callable[[], T], outages: Outages, *, settles: bool = True) -> T:
    """`call()`, tried again with back-off while the database is unreachable, restarting or out
    of disk, within this thread's `patience()` (none: tried once).
    Raises DatabaseUnreachable when the outage outlasts it; any other error at once. For calls
    that are safe to repeat: a statement that may have gone through before its answer was lost
    is checked by its lease token when it runs again. What it meets is noted in `outages` (the
    database's); `settles`: a success ends the outage going on (not so a connect, which a full
    disk still allows)."""
    patient = patience()
    delay = None if patient is None else patient.first_retry_s
    while True:
        try:
            result = call()
        except Exception as error:
            reason = outage_reason(error)
            if reason is None:
                raise
            outage = outages.unreachable(reason)
            if patient is None or delay is None:
                raise
            waited = time.monotonic() - outage.started
            if waited + delay > patient.wait_s:
                raise DatabaseUnreachable(outage.wall, waited, reason) from None
            outages.say(outage, delay)
            time.sleep(delay)
            delay = min(2 * delay, patient.most_between_s)
        else:
            if settles:
                outages.reachable()
            return result
