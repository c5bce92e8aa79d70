"""The leases one run holds, kept alive by one background heartbeat thread.

A run claims through this object, so the heartbeat knows every lease the run holds. Each beat is a
single statement that refreshes the run's heartbeat row and returns the tokens the run still owns;
a held lease missing from that answer was taken away (reaped or released), and the step learns it
from `check()` / `is_lost()` and stops that unit of work cleanly. Nothing here exits the process.

A run also fences itself: once its last successful beat is older than `FENCE_AT` of a lease's
life (`stale_after_s`), its leases may be about to go, or gone, without it hearing so (a
partition, a paused machine, a database restarting). `check()` then touches nothing until a beat
gets through: the lease still held, the work goes on (a short outage costs nothing); lost, it
raises LeaseLost; no beat within another lease's life, it raises `LeaseFenced`, and the stage
stops touching the item's files. No database call is made under the lock, so a beat stuck on the
network never holds up the step's own checks and claims.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

import sqlalchemy as sa

from dataminer_dagster.core.process_liveness import process_space
from dataminer_dagster.db.file_changes import live_tokens
from dataminer_dagster.db.leases import (
    FailResult,
    Lease,
    LeaseFenced,
    LeaseLost,
    LeaseStore,
    Unclaimed,
)

_log = logging.getLogger(__name__)

# The share of a lease's life after which a run that has not reached the database stops touching
# its items' files: the rest is the margin for a file change begun just before.
FENCE_AT = 0.75


class RunLeases:
    def __init__(self, store: LeaseStore, owner: str, *, heartbeat_s: float, stale_after_s: float):
        self.store = store
        self.owner = owner
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self._held: dict[uuid.UUID, Lease] = {}
        self._lost: set[uuid.UUID] = set()
        # When the last successful beat was sent (time.monotonic()); None before the first.
        self._last_beat: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._host, self._pid, self._space = socket.gethostname(), os.getpid(), process_space()

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.beat()  # the heartbeat row exists before the first claim
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{self.owner[:8]}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s + 5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except (
                Exception
            ) as exc:  # a database hiccup must not kill the run; the next beat retries
                _log.warning("heartbeat for run %s failed: %s", self.owner, exc)

    def beat(self) -> None:
        """Refresh the run's heartbeat; leases held before it was sent and missing from its answer
        are lost (one claimed meanwhile is judged by the next beat)."""
        with self._lock:
            held = set(self._held)
        sent = time.monotonic()
        alive = self.store.liveness.heartbeat(self.owner, self._host, self._pid, self._space)
        with self._lock:
            self._last_beat = max(self._last_beat or sent, sent)
            newly_lost = (held & set(self._held)) - alive - self._lost
            self._lost |= newly_lost
            lost = [self._held[token] for token in newly_lost]
        for lease in lost:
            _log.warning("run %s lost its lease on %s %s", self.owner, lease.stage, lease.key)

    def silent_s(self) -> float:
        """Seconds since the last successful beat was sent (0 before the first)."""
        last = self._last_beat
        return 0.0 if last is None else time.monotonic() - last

    # --- claiming ---------------------------------------------------------------------------

    def claim_next(self, stage: str, limit: int) -> list[Lease]:
        leases = self.store.claim_next(stage, self.owner, limit)
        with self._lock:
            self._held.update((lease.token, lease) for lease in leases)
        return leases

    def claim_keys(
        self,
        stage: str,
        keys: Sequence[str],
        *,
        redo: bool = False,
        revive_dead: bool = False,
        respect_backoff: bool = True,
        projects: Sequence[int] | None = None,
    ) -> tuple[list[Lease], list[Unclaimed]]:
        leases, unclaimed = self.store.claim_keys(
            stage,
            keys,
            self.owner,
            redo=redo,
            revive_dead=revive_dead,
            respect_backoff=respect_backoff,
            projects=projects,
        )
        with self._lock:
            self._held.update((lease.token, lease) for lease in leases)
        return leases, unclaimed

    # --- state of a lease -------------------------------------------------------------------

    def is_lost(self, lease: Lease) -> bool:
        return lease.token in self._lost

    def begin(self, lease: Lease) -> None:
        """Begin work on an item: raises LeaseLost if it was taken away, and marks it started."""
        self.check(lease)
        self.store.mark_started(lease)

    def check(self, lease: Lease) -> None:
        """Call before changing the item's files: raises LeaseLost when the heartbeat found the
        lease taken away. When no beat has reached the database for `FENCE_AT` of a lease's life,
        waits for one first, and raises LeaseFenced if none comes within a lease's life."""
        if self.is_lost(lease):
            raise LeaseLost(lease)
        if self._fenced() and not self._wait_for_a_beat(self.stale_after_s):
            raise LeaseFenced(lease, self.silent_s(), self.stale_after_s)
        if self.is_lost(lease):
            raise LeaseLost(lease)

    def _fenced(self) -> bool:
        return self.silent_s() > FENCE_AT * self.stale_after_s

    def _wait_for_a_beat(self, within_s: float) -> bool:
        """Wait up to `within_s` for a beat to get through (the heartbeat thread's). True when
        one did."""
        deadline = time.monotonic() + within_s
        while self._fenced():
            if time.monotonic() > deadline or self._stop.is_set():
                return False
            time.sleep(min(0.1, self.heartbeat_s / 4))
        return True

    def live_tokens(self, tokens: Collection[str]) -> set[str]:
        """The tokens (hex) among `tokens` whose leases are live now, by the database: whose
        leftover files must stay (db/file_changes.py)."""
        return live_tokens(self.store.engine, tokens)

    @property
    def held(self) -> list[Lease]:
        with self._lock:
            return [lease for token, lease in self._held.items() if token not in self._lost]

    # --- finishing (the lease is forgotten whatever the outcome) ------------------------------

    @contextmanager
    def completing(self, lease: Lease, outcome: dict | None = None) -> Iterator[sa.Connection]:
        """See LeaseStore.completing; raises LeaseLost without touching the database when the
        heartbeat already saw the lease go."""
        try:
            self.check(lease)
            with self.store.completing(lease, outcome) as conn:
                yield conn
        finally:
            self._forget(lease)

    def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        then: Callable[[sa.Connection], None] | None = None,
    ) -> FailResult:
        try:
            return self.store.fail(lease, error, retryable=retryable, then=then)
        finally:
            self._forget(lease)

    def postpone(self, lease: Lease, reason: str, not_before: datetime | None = None) -> FailResult:
        try:
            return self.store.postpone(lease, reason, not_before)
        finally:
            self._forget(lease)

    def block(self, lease: Lease, reason: str) -> bool:
        try:
            return self.store.block(lease, reason)
        finally:
            self._forget(lease)

    def release_many(self, leases: Sequence[Lease]) -> list[Lease]:
        try:
            return self.store.release_many(leases)
        finally:
            for lease in leases:
                self._forget(lease)

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.token, None)
            self._lost.discard(lease.token)
