"""The host throttle's tables: pauses, request turns and download slots per host, shared by every
run on every machine (`db/shared_throttle.py` puts them behind acquisition's interface).

* A **pause** is a row of `host_pauses`: no run sends the host a request before `paused_until`.
  The row stays after the pause ends; `strikes` (pauses in a row without a success in between)
  sets the length of the next pause when the host gives no Retry-After.
* A **request turn** (`host_turn`) is a transaction-scoped advisory lock per host, held from
  reading the pause until the request's answer is known and recorded: an answer that says "stop"
  is committed before any other run's request leaves, so no request is sent during a pause, even
  by runs that were about to send one. The lock ends with its transaction, or with the session
  when its process dies; bodies are transferred after the turn, in parallel.
* A **download slot** is a row of `download_slots` held by a download; at most `limit` per host.
  Slots of runs whose heartbeat is stale are taken over.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from dataminer_dagster.core.progress import format_seconds
from dataminer_dagster.db.schema import SCHEMA

P = f"{SCHEMA}.host_pauses"
D = f"{SCHEMA}.download_slots"
H = f"{SCHEMA}.run_heartbeats"

# Advisory lock namespaces (the two-key form; migrations use the one-key form): 'host', 'slot'.
_TURN_LOCKS = 0x686F7374
_SLOT_LOCKS = 0x736C6F74

# Times of a pause are read from the clock, not from now(): now() is when the turn's transaction
# began, before it waited for the turn and for the request's answer, so a pause measured from it
# ended early (by the wait: seconds, with many downloads of one host at once).
_PAUSE_COLUMNS = """host, paused_at, paused_until, kind, reason, strikes, pauses, run_id,
                    extract(epoch FROM paused_until - clock_timestamp()) AS remaining_s"""

_LOCK = sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:key))")

_READ = sa.text(f"SELECT {_PAUSE_COLUMNS} FROM {P} WHERE host = :key")

# A pause never shortens one in force, and counts a strike only when none is in force.
_PAUSE = sa.text(f"""
    INSERT INTO {P} AS p (host, paused_at, paused_until, kind, reason, strikes, pauses, run_id)
    SELECT :key, answered, answered + make_interval(secs => :delay), :kind, :reason, 1, 1, :run
      FROM (SELECT clock_timestamp() AS answered) AS clock
    ON CONFLICT (host) DO UPDATE SET
        paused_at = CASE WHEN p.paused_until > EXCLUDED.paused_at THEN p.paused_at
                         ELSE EXCLUDED.paused_at END,
        strikes = CASE WHEN p.paused_until > EXCLUDED.paused_at THEN p.strikes
                       ELSE p.strikes + 1 END,
        pauses = CASE WHEN p.paused_until > EXCLUDED.paused_at THEN p.pauses
                      ELSE p.pauses + 1 END,
        kind = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.kind ELSE p.kind END,
        reason = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.reason
                      ELSE p.reason END,
        run_id = CASE WHEN EXCLUDED.paused_until > p.paused_until THEN EXCLUDED.run_id
                      ELSE p.run_id END,
        paused_until = greatest(p.paused_until, EXCLUDED.paused_until),
        updated_at = now()
    RETURNING {_PAUSE_COLUMNS}
""")

_SUCCEEDED = sa.text(
    f"UPDATE {P} SET strikes = 0, updated_at = now() WHERE host = :key AND strikes > 0"
)

# Under the host's slot lock: drop the slots of runs that stopped heartbeating, then take one if
# fewer than :limit are held.
_TAKE_SLOT = sa.text(f"""
    WITH live AS (
        SELECT s.token FROM {D} s
         WHERE s.host = :host
           AND EXISTS (SELECT 1 FROM {H} h WHERE h.run_id = s.run_id
                         AND h.heartbeat_at > now() - make_interval(secs => :stale))),
    gone AS (DELETE FROM {D} s WHERE s.host = :host AND s.token NOT IN (SELECT token FROM live))
    INSERT INTO {D} (token, host, run_id)
    SELECT :token, :host, :run WHERE (SELECT count(*) FROM live) < :limit
    RETURNING token
""")

_RELEASE_SLOT = sa.text(f"DELETE FROM {D} WHERE token = :token")


@dataclass(frozen=True)
class HostPause:
    """A host's pause row: in force while `remaining_s` > 0."""

    host: str  # the host, or "<host> via <proxy>"
    since: datetime
    until: datetime
    remaining_s: float  # by the database clock, when read
    kind: str
    reason: str
    strikes: int  # pauses in a row without a success in between
    pauses: int  # pauses of this host so far
    run_id: str | None  # the run that met the throttle

    @property
    def in_force(self) -> bool:
        return self.remaining_s > 0

    def describe(self) -> str:
        return (
            f"{self.host}: paused until {self.until:%Y-%m-%d %H:%M:%S %Z} "
            f"({format_seconds(max(self.remaining_s, 0.0))} left): {self.reason}"
        )

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "remaining_s": round(self.remaining_s, 1),
            "kind": self.kind,
            "reason": self.reason,
            "pauses": self.pauses,
            "run_id": self.run_id,
        }


def _row(row) -> HostPause:
    return HostPause(
        row.host,
        row.paused_at,
        row.paused_until,
        float(row.remaining_s),
        row.kind,
        row.reason,
        row.strikes,
        row.pauses,
        row.run_id,
    )


def read_pause(engine: sa.Engine, key: str) -> HostPause | None:
    """The pause row of `key` (in force or not), if it ever had one."""
    with engine.connect() as conn:
        row = conn.execute(_READ, {"key": key}).one_or_none()
    return None if row is None else _row(row)


def active_pauses(engine: sa.Engine) -> list[HostPause]:
    """The hosts paused now, the longest pause first (what `dataminer status` shows)."""
    statement = sa.text(
        f"SELECT {_PAUSE_COLUMNS} FROM {P} WHERE paused_until > now() ORDER BY paused_until DESC"
    )
    with engine.connect() as conn:
        return [_row(r) for r in conn.execute(statement)]


class HostTurn:
    """The turn of one request to `key`: `found` is its pause row when the turn began."""

    def __init__(self, conn: sa.Connection, key: str, found: HostPause | None):
        self._conn = conn
        self.key = key
        self.found = found

    def pause(self, delay_s: float, kind: str, reason: str, run_id: str | None) -> HostPause:
        """Pause the host for `delay_s` (never shortening a pause in force)."""
        params = {"key": self.key, "delay": delay_s, "kind": kind, "reason": reason, "run": run_id}
        self.found = _row(self._conn.execute(_PAUSE, params).one())
        return self.found

    def succeeded(self) -> None:
        """The host answered: its strikes start again from zero."""
        if self.found is not None and self.found.strikes:
            self._conn.execute(_SUCCEEDED, {"key": self.key})


@contextmanager
def host_turn(engine: sa.Engine, key: str) -> Iterator[HostTurn]:
    """Take the turn of `key` (waiting while another request to it waits for its answer) and
    read its pause. What the turn records stands whatever the request did: the transaction is
    committed at the end in every case, which also ends the turn."""
    with engine.connect() as conn:
        transaction = conn.begin()
        try:
            # Waiting for the turn is what it is for; each holder's wait for its answer is bounded
            # (the request's timeout, and the session's idle-in-transaction timeout: db/engine.py).
            conn.execute(sa.text("SET LOCAL lock_timeout = 0"))
            conn.execute(_LOCK, {"space": _TURN_LOCKS, "key": key})
            row = conn.execute(_READ, {"key": key}).one_or_none()
            yield HostTurn(conn, key, None if row is None else _row(row))
        finally:
            if transaction.is_active:
                transaction.commit()


def take_slot(
    engine: sa.Engine, host: str, limit: int, token: uuid.UUID, run_id: str, stale_after_s: float
) -> bool:
    """Take one of `limit` download slots of `host` for run `run_id`, if one is free."""
    params = {"host": host, "limit": limit, "token": token, "run": run_id, "stale": stale_after_s}
    with engine.begin() as conn:
        conn.execute(_LOCK, {"space": _SLOT_LOCKS, "key": host})
        return conn.execute(_TAKE_SLOT, params).first() is not None


def release_slot(engine: sa.Engine, token: uuid.UUID) -> None:
    with engine.begin() as conn:
        conn.execute(_RELEASE_SLOT, {"token": token})
