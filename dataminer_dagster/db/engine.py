"""One SQLAlchemy engine per (database URL, process), created on first use, never at import.

Every connection has bounded waits, sized from the lease settings (`bounded_waits`): a worker cut
off from the database (a partition, a paused VM) never holds a row lock, nor waits for one, longer
than a lease lives, so the reaper can take its items and another run can finish them.

In a process that waits for the database (db/outages.py `waiting_for_the_database`: a run, `dataminer
run`), a connection that cannot be made because the server is down, restarting or unreachable is
tried again with back-off instead of failing its caller (`_wait_for_the_server`).

A forked child keeps the engines but not their pooled connections (`_drop_inherited_connections`):
those sockets are the parent's.
"""

from __future__ import annotations

import functools
import os
import threading

import sqlalchemy as sa

from dataminer_dagster.db.outages import Outages, outages_of, wait_out
from dataminer_dagster.settings import LeasePolicy

_lock = threading.Lock()
_engines: dict[tuple[str, bool], sa.Engine] = {}
_leases: dict[str, LeasePolicy] = {}  # the lease settings each URL's engines were sized from


def bounded_waits(lease: LeasePolicy) -> dict[str, str | int]:
    """libpq connection parameters for a lease that goes stale after `stale_after_s` (s):

    * connect timeout and TCP keepalives (and a TCP user timeout for unacknowledged data) notice
      a lost server within a quarter of it, not after the kernel's two hours;
    * `lock_timeout`: no statement waits for a lock longer than a quarter of it;
    * `idle_in_transaction_session_timeout`: the server ends a session left idle in a transaction
      (its client cut off mid-transaction) after half of it, releasing its row locks before its
      lease goes stale;
    * `statement_timeout`: no statement runs longer than a lease lives.
    """
    stale = lease.stale_after_s
    quarter = max(1, int(stale / 4))
    millis = {
        "statement_timeout": int(stale * 1000),
        "lock_timeout": quarter * 1000,
        "idle_in_transaction_session_timeout": max(1, int(stale / 2)) * 1000,
    }
    return {
        "connect_timeout": max(2, min(10, quarter)),
        "keepalives": 1,
        "keepalives_idle": max(1, int(stale / 8)),
        "keepalives_interval": max(1, int(stale / 24)),
        "keepalives_count": 3,
        "tcp_user_timeout": quarter * 1000,
        "options": " ".join(f"-c {name}={value}" for name, value in millis.items()),
    }


def get_engine(
    url: str, *, autocommit: bool = False, lease: LeasePolicy | None = None
) -> sa.Engine:
    """The process's engine for `url`. `autocommit`: a separate pool whose connections run each
    statement on its own (one round trip, no BEGIN/COMMIT), for single-statement operations.
    `lease`: the lease settings its connections' waits are sized from (`bounded_waits`); the
    first given for a URL stands for every engine of it, the defaults where none is."""
    key = (url, autocommit)
    with _lock:
        if lease is not None:
            _leases.setdefault(url, lease)
        engine = _engines.get(key)
        if engine is None:
            engine = sa.create_engine(
                url,
                pool_pre_ping=True,  # survive a database restart without failing the next statement
                pool_size=4,
                max_overflow=8,
                connect_args={
                    "application_name": "dataminer",
                    **bounded_waits(_leases.get(url, LeasePolicy())),
                },
                **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
            )
            waiting = functools.partial(_wait_for_the_server, outages_of(engine.url))
            sa.event.listen(engine, "do_connect", waiting)
            _engines[key] = engine
        return engine


def _wait_for_the_server(outages: Outages, dialect, conn_rec, cargs, cparams):
    """Connect, waiting out an outage where this process waits for the database (a connect is
    always safe to repeat: nothing was sent yet). A connection made says nothing of whether the
    outage is over (a full disk refuses writes, not connections)."""
    return wait_out(lambda: dialect.connect(*cargs, **cparams), outages, settles=False)


def dispose_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def _drop_inherited_connections() -> None:
    """In a forked child: forget the parent's pooled connections without closing them (they are
    the parent's), so every engine, ours or one Dagster's storages hold, connects anew instead of
    sharing a socket with the parent. The lock is new too: a parent thread may have held it."""
    global _lock
    _lock = threading.Lock()
    for engine in _engines.values():
        engine.dispose(close=False)


os.register_at_fork(after_in_child=_drop_inherited_connections)
