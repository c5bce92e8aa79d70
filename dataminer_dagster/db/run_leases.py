"""The leases one run holds, kept alive by one background heartbeat thread.

A run claims through this object, so the heartbeat knows every lease the run holds. Each beat is a
single statement that refreshes the run's heartbeat row and returns the tokens the run still owns;
a held lease missing from that answer was taken away (reaped or released), and the step learns it
from `check()` / `is_lost()` and stops that unit of work cleanly. Nothing here exits the process.

A run also fences itself: once its last successful beat is older than `FENCE_AT` of a lease's
life (`stale_after_s`), its leases may be about to go, or gone, without it hearing so (a
partition, a paused machine, a database restarting). `check()` then touches nothing until a beat
gets through: the lease still held, the work goes on (an outage costs nothing: the reaper judges
silence only over time the database was up); lost, it raises LeaseLost. It waits for that beat for
up to `outage_wait_s` while the database is unreachable, restarting or out of disk (db/outages.py),
for a lease's life otherwise (a beat refused for another reason), and then raises `LeaseFenced`,
and the stage stops touching the item's files. The run's other claim operations wait out an
outage the same way. No database call is made under the lock, so a beat stuck on the network never
holds up the step's own checks and claims.
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
from pathlib import Path
from typing import TypeVar

import sqlalchemy as sa

from dataminer_dagster.core.process_liveness import process_space
from dataminer_dagster.db.file_changes import forget_staged, live_tokens
from dataminer_dagster.db.leases import (
    FailResult,
    Lease,
    LeaseFenced,
    LeaseLost,
    LeaseStore,
    Unclaimed,
)
from dataminer_dagster.db.outages import (
    not_waiting_for_the_database,
    outage_reason,
    outages_of,
    wait_out,
)

_log = logging.getLogger(__name__)

T = TypeVar("T")

# The share of a lease's life after which a run that has not reached the database stops touching
# its items' files: the rest is the margin for a file change begun just before.
FENCE_AT = 0.75


class RunLeases:
    def __init__(
        self,
        store: LeaseStore,
        owner: str,
        *,
        heartbeat_s: float,
        stale_after_s: float,
        outage_wait_s: float | None = None,
    ):
        self.store = store
        self.owner = owner
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        # How long a fenced check waits for a database that is away (None: a lease's life).
        self.outage_wait_s = stale_after_s if outage_wait_s is None else outage_wait_s
        self._beat_met_outage = False  # the last beat failed because the database was away
        self._outages = outages_of(store.engine.url)
        self._held: dict[uuid.UUID, Lease] = {}
        self._lost: set[uuid.UUID] = set()
        # When the last successful beat was sent (time.monotonic()); None before the first.
        self._last_beat: float | None = None
        self._lock = threading.Lock()
        # One claim at a time, so that a claim reading back what a lost try of it took (`_claiming`)
        # never takes what another thread's claim took and has not recorded yet.
        self._claim_lock = threading.Lock()
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
        # A beat never waits for the database inside a connect: it fails at once and the next one
        # tries again, so that a beat that gets through was sent (`_last_beat`) just before.
        with not_waiting_for_the_database():
            self._beat_every_heartbeat()

    def _beat_every_heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.beat()
            except Exception as exc:  # a database hiccup must not kill the run: beat again
                reason = outage_reason(exc)
                self._beat_met_outage = reason is not None
                if reason is None:
                    _log.warning("heartbeat for run %s failed: %s", self.owner, exc)
                else:
                    self._outages.say(self._outages.unreachable(reason), self.heartbeat_s)
            else:
                self._beat_met_outage = False
                self._outages.reachable()

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
        with self._claim_lock:
            leases = self._claiming(
                stage, None, lambda: self.store.claim_next(stage, self.owner, limit)
            )
            if len(leases) > limit:  # a claim's answer lost while another was still under way
                self._waiting(lambda: self.store.release_many(leases[limit:]))
                leases = leases[:limit]
            self._hold(leases)
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
        unclaimed: list[Unclaimed] = []

        def claim() -> list[Lease]:
            leases, why = self.store.claim_keys(
                stage,
                keys,
                self.owner,
                redo=redo,
                revive_dead=revive_dead,
                respect_backoff=respect_backoff,
                projects=projects,
            )
            unclaimed[:] = why
            return leases

        with self._claim_lock:
            leases = self._claiming(stage, keys, claim)
            if not unclaimed:  # read back: why the others were not claimed, asked now
                unclaimed = self._waiting(lambda: self.store.why_unclaimed(stage, keys, leases))
            self._hold(leases)
        return leases, unclaimed

    def _claiming(
        self, stage: str, keys: Sequence[str] | None, claim: Callable[[], list[Lease]]
    ) -> list[Lease]:
        """`claim()`, waiting out an outage. A claim whose connection was lost may have gone
        through before it went: tried again, it would find its items running under this run
        and take others, and the first ones would stay with this run, unknown to it and worked
        on by no one until it ends. So each try after the first reads back first what this run
        holds of the stage (among `keys`) and has not begun, without knowing of it: found, that
        is the claim's outcome; none, the claim did not go through and is made again."""
        tries = 0

        def once() -> list[Lease]:
            nonlocal tries
            tries += 1
            if tries > 1:
                with self._lock:
                    known = set(self._held)
                if found := self.store.unknown_leases(stage, self.owner, known, keys):
                    _log.warning(
                        "run %s: a claim of %s whose answer was lost had gone through; its %d "
                        "items are this run's",
                        self.owner,
                        stage,
                        len(found),
                    )
                    return found
            return claim()

        return self._waiting(once)

    def _hold(self, leases: Sequence[Lease]) -> None:
        with self._lock:
            self._held.update((lease.token, lease) for lease in leases)

    # --- state of a lease -------------------------------------------------------------------

    def is_lost(self, lease: Lease) -> bool:
        return lease.token in self._lost

    def begin(self, lease: Lease) -> None:
        """Begin work on an item: raises LeaseLost if it was taken away, and marks it started."""
        self.check(lease)
        self._waiting(lambda: self.store.mark_started(lease))

    def check(self, lease: Lease) -> None:
        """Call before changing the item's files: raises LeaseLost when the heartbeat found the
        lease taken away. When no beat has reached the database for `FENCE_AT` of a lease's life,
        waits for one first, and raises LeaseFenced if none comes within a lease's life."""
        if self.is_lost(lease):
            raise LeaseLost(lease)
        if self._fenced() and not self._wait_for_a_beat():
            raise LeaseFenced(lease, self.silent_s(), self.stale_after_s)
        if self.is_lost(lease):
            raise LeaseLost(lease)

    def _fenced(self) -> bool:
        return self.silent_s() > FENCE_AT * self.stale_after_s

    def _wait_for_a_beat(self) -> bool:
        """Wait for a beat to get through (the heartbeat thread's): for up to `outage_wait_s`
        while the database is away, a lease's life otherwise. True when one did."""
        started = time.monotonic()
        while self._fenced():
            away = self._beat_met_outage or self._outages.going_on
            within_s = self.outage_wait_s if away else self.stale_after_s
            if time.monotonic() - started > within_s or self._stop.is_set():
                return False
            time.sleep(min(0.1, self.heartbeat_s / 4))
        return True

    def live_tokens(
        self, tokens: Collection[str], staging: tuple[Lease, Path] | None = None
    ) -> set[str]:
        """The tokens (hex) among `tokens` whose leases are live now, by the database: whose
        leftover files must stay. `staging`: (lease, final) of an output that lease is about to
        stage, recorded meanwhile (db/file_changes.py)."""
        recorded = None if staging is None else (staging[0].token.hex, staging[1])
        return live_tokens(self.store.engine, tokens, recorded)

    def forget_staged(self, lease: Lease) -> None:
        """`lease` removed its staging: no leftover of it is to be looked for (db/file_changes.py)."""
        with self.store.engine.begin() as conn:
            forget_staged(conn, lease.token.hex)

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
            return self._waiting(
                lambda: self.store.fail(lease, error, retryable=retryable, then=then)
            )
        finally:
            self._forget(lease)

    def postpone(self, lease: Lease, reason: str, not_before: datetime | None = None) -> FailResult:
        try:
            return self._waiting(lambda: self.store.postpone(lease, reason, not_before))
        finally:
            self._forget(lease)

    def block(self, lease: Lease, reason: str) -> bool:
        try:
            return self._waiting(lambda: self.store.block(lease, reason))
        finally:
            self._forget(lease)

    def release_many(self, leases: Sequence[Lease]) -> list[Lease]:
        try:
            return self._waiting(lambda: self.store.release_many(leases))
        finally:
            for lease in leases:
                self._forget(lease)

    def _waiting(self, call: Callable[[], T]) -> T:
        """`call()`, waiting out an outage where this process waits for the database. A repeat of
        an operation that went through before its answer was lost changes nothing: it finds its
        lease token gone (a claim reads back what it took: `_claiming`)."""
        return wait_out(call, self._outages)

    def _forget(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.token, None)
            self._lost.discard(lease.token)
