"""One SQLAlchemy engine per (database URL, process), created on first use, never at import.

A forked child keeps the engines but not their pooled connections (`_drop_inherited_connections`):
those sockets are the parent's.
"""

from __future__ import annotations

import os
import threading

import sqlalchemy as sa

_lock = threading.Lock()
_engines: dict[tuple[str, bool], sa.Engine] = {}


def get_engine(url: str, *, autocommit: bool = False) -> sa.Engine:
    """The process's engine for `url`. `autocommit`: a separate pool whose connections run each
    statement on its own (one round trip, no BEGIN/COMMIT), for single-statement operations."""
    key = (url, autocommit)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = sa.create_engine(
                url,
                pool_pre_ping=True,  # survive a database restart without failing the next statement
                pool_size=4,
                max_overflow=8,
                connect_args={"application_name": "dataminer"},
                **({"isolation_level": "AUTOCOMMIT"} if autocommit else {}),
            )
            _engines[key] = engine
        return engine


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
