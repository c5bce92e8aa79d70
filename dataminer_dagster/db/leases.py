"""Lease operations on work items: the only code that changes a work item's status.

Every operation is one conditional SQL statement. A lease belongs to a Dagster run (`lease_owner`)
and is identified by a random `lease_token`; completing, failing or releasing checks the token, so a
run that lost its lease (reaped, or released by the run-failure sensor) changes nothing and is told
so. Liveness is per run: one `run_heartbeats` row, refreshed by the run's resource thread.
Errors are stored redacted (core/redact.py): a video URL's password or token never reaches
`last_error`, nor what reads it (status, logs, project errors).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.file_changes import committing
from dataminer_dagster.db.lease_sql import (
    BACKOFF_AT,
    CLEAR_LEASE,
    COMPLETE,
    CONCERNS_PROJECTS,
    HELD,
    LEASE_COLUMNS,
    RECORD_FINGERPRINT,
    UNCOUNTED_STATUS,
    ClaimStatements,
    W,
    claim_next_statement,
    fail_set,
)
from dataminer_dagster.db.run_liveness import RunLiveness
from dataminer_dagster.db.schema import (
    BLOCKED,
    CLAIMABLE,
    DEAD,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    stale_sql,
)
from dataminer_dagster.settings import RetryPolicy


class LeaseLost(Exception):
    """The lease was taken from this run (reaped or released); its work must not be published."""

    def __init__(self, lease: Lease, reason: str | None = None):
        self.lease = lease
        super().__init__(
            f"{lease.stage} {lease.key}: "
            + (
                reason
                or "lease lost (another run owns this item now, or it was released after this "
                "run stopped heartbeating)"
            )
            + "; this run's result is discarded"
        )


class LeaseFenced(LeaseLost):
    """This run's heartbeats have not reached the database for most of a lease's life: its leases
    may be another run's by now, so it stops touching their files (db/run_leases.py)."""

    def __init__(self, lease: Lease, silent_s: float, stale_after_s: float):
        super().__init__(
            lease,
            f"no heartbeat of this run has reached the database for {silent_s:.0f} s (a lease "
            f"goes stale after {stale_after_s:g} s), so another run may own this item now: this "
            "run stops touching its files",
        )


@dataclass(frozen=True)
class Lease:
    item_id: int
    stage: str
    key: str
    token: uuid.UUID
    owner: str
    attempt: int
    max_attempts: int
    project_id: int | None
    video_id: str | None
    fingerprint: str | None = None  # of the project's config the claim was made under


@dataclass(frozen=True)
class Unclaimed:
    """Why a requested key was not claimed."""

    key: str
    status: str | None  # None: no such work item
    owner: str | None
    next_attempt_at: datetime | None
    last_error: str | None
    finished_at: datetime | None = None
    outcome: dict | None = None  # a done item's summary
    fingerprint: str | None = None  # of the project's config the item was done with
    video_id: str | None = None  # the item's video, for a per-video item

    def describe(self) -> str:
        if self.status is None:
            return f"{self.key}: unknown to the claim tables (add the video or project first)"
        if self.status == RUNNING:
            return f"{self.key}: already being processed by run {self.owner}"
        if self.status in CLAIMABLE:
            return (
                f"{self.key}: waiting for its retry at {self.next_attempt_at:%Y-%m-%d %H:%M:%S %Z}"
            )
        reason = f" ({self.last_error})" if self.last_error else ""
        return f"{self.key}: already {self.status}{reason}"


@dataclass(frozen=True)
class FailResult:
    applied: bool  # False: the lease was lost, nothing changed
    status: str | None  # failed (will retry) or dead
    next_attempt_at: datetime | None


def _held(leases: Sequence[Lease]) -> dict:
    return {"ids": [lease.item_id for lease in leases], "tokens": [lease.token for lease in leases]}


def _lost(leases: Sequence[Lease], changed_ids: Iterable[int]) -> list[Lease]:
    changed = set(changed_ids)
    return [lease for lease in leases if lease.item_id not in changed]


def _lease(row: Any) -> Lease:  # a row with the lease columns as attributes
    return Lease(
        item_id=row.id,
        stage=row.stage,
        key=row.item_key,
        token=row.lease_token,
        owner=row.lease_owner,
        attempt=row.attempts,
        max_attempts=row.max_attempts,
        project_id=row.project_id,
        video_id=row.video_id,
        fingerprint=row.fingerprint,
    )


class LeaseStore:
    """The work items' leases: queueing, claiming, finishing, retrying; the runs' heartbeats and
    recovery are its `liveness` (`RunLiveness`), on the same statements."""

    def __init__(self, engine: sa.Engine, retry: RetryPolicy | None = None):
        self.engine = engine
        self.statements = ClaimStatements(engine, retry)
        self.liveness = RunLiveness(self.statements)

    # --- queueing ---------------------------------------------------------------------------

    def enqueue(
        self,
        stage: str,
        keys: Sequence[str],
        *,
        project_ids: Sequence[int | None] | None = None,
        video_ids: Sequence[str | None] | None = None,
        reset: Sequence[str] = (),
        conn: sa.Connection | None = None,
        requested: bool = False,
    ) -> int:
        """Create pending items; existing ones whose status is in `reset` become pending again
        with fresh attempts. Running items are never touched. Returns how many became pending.
        `requested`: a run that will take them is already on its way (see scheduling)."""
        if not keys:
            return 0
        n = len(keys)
        statement = sa.text(f"""
            INSERT INTO {W} (stage, item_key, project_id, video_id, max_attempts, requested_at)
            SELECT :stage, k, p, v, :max_attempts, CASE WHEN :requested THEN now() END
            FROM unnest(CAST(:keys AS text[]), CAST(:projects AS int[]), CAST(:videos AS text[])) AS t(k, p, v)
            ON CONFLICT (stage, item_key) DO UPDATE
               SET status = '{PENDING}', attempts = 0, next_attempt_at = now(), last_error = NULL,
                   requested_at = EXCLUDED.requested_at, finished_at = NULL,
                   max_attempts = EXCLUDED.max_attempts, updated_at = now()
             WHERE {W}.status = ANY(CAST(:reset AS text[]))
            RETURNING id
        """)
        params = {
            "stage": stage,
            "keys": list(keys),
            "projects": list(project_ids) if project_ids is not None else [None] * n,
            "videos": list(video_ids) if video_ids is not None else [None] * n,
            "reset": [s for s in reset if s != RUNNING],
            "max_attempts": self.statements.policy.max_attempts,
            "requested": requested,
        }
        return len(self.statements.run(statement, params, conn))

    def mark(
        self,
        stage: str,
        key: str,
        status: str,
        reason: str,
        *,
        project_id: int | None = None,
        video_id: str | None = None,
        outcome: dict | None = None,
        conn: sa.Connection | None = None,
    ) -> bool:
        """Set a finished status (blocked, dead, done) on an item that is not running, creating it
        if needed: for outcomes decided outside the item's own stage (a project's rule, work done
        by the CLI, a copy processed as its original). `reason` is kept as the error, or as the
        outcome's note for done (with `outcome`'s entries)."""
        if status not in (DONE, DEAD, BLOCKED):
            raise ValueError(f"mark() sets a finished status, not {status!r}")
        statement = sa.text(f"""
            INSERT INTO {W} (stage, item_key, project_id, video_id, max_attempts, status, last_error,
                             outcome, finished_at)
            VALUES (:stage, :key, :project, :video, :max_attempts, :status,
                    CASE WHEN :status = '{DONE}' THEN NULL ELSE :reason END,
                    CASE WHEN :status = '{DONE}' THEN jsonb_build_object('note', CAST(:reason AS text))
                                                        || coalesce(CAST(:outcome AS jsonb), '{{}}') END, now())
            ON CONFLICT (stage, item_key) DO UPDATE
               SET status = EXCLUDED.status, last_error = EXCLUDED.last_error, outcome = EXCLUDED.outcome,
                   finished_at = now(), updated_at = now(), fingerprint = NULL
             WHERE {W}.status <> '{RUNNING}'
            RETURNING id
        """)
        params = {
            "stage": stage,
            "key": key,
            "project": project_id,
            "video": video_id,
            "max_attempts": self.statements.policy.max_attempts,
            "status": status,
            "reason": redact(reason),
            "outcome": _json(outcome),
        }
        return bool(self.statements.run(statement, params, conn))

    # --- claiming ---------------------------------------------------------------------------

    def claim_next(self, stage: str, owner: str, limit: int = 1) -> list[Lease]:
        """Claim up to `limit` claimable items of `stage`, skipping locked rows: the longest due
        first, and items due at the same time in the order they were queued."""
        rows = self.statements.run(claim_next_statement(limit), {"stage": stage, "owner": owner})
        return sorted((_lease(r) for r in rows), key=lambda lease: lease.item_id)

    def claim_keys(
        self,
        stage: str,
        keys: Sequence[str],
        owner: str,
        *,
        redo: bool = False,
        revive_dead: bool = False,
        respect_backoff: bool = True,
        projects: Sequence[int] | None = None,
    ) -> tuple[list[Lease], list[Unclaimed]]:
        """Claim the named items that are claimable (with `revive_dead`, dead ones too, with fresh
        attempts; with `redo`, every finished one; stale ones, finished under an earlier config,
        always) and, with `projects`, concern one of these projects. Returns the leases and, for
        every other key, why it was not claimed."""
        if not keys:
            return [], []
        statuses = [PENDING, FAILED] + (
            [DONE, DEAD, BLOCKED] if redo else [DEAD] if revive_dead else []
        )
        statement = sa.text(f"""
            UPDATE {W} w
               SET status = '{RUNNING}', lease_owner = :owner, lease_token = gen_random_uuid(),
                   leased_at = now(), started_at = NULL, updated_at = now(), last_error = NULL,
                   finished_at = NULL, {RECORD_FINGERPRINT},
                   attempts = CASE WHEN w.status IN ('{DONE}', '{DEAD}', '{BLOCKED}') THEN 1
                                   ELSE w.attempts + 1 END
              FROM (SELECT id FROM {W} s
                     WHERE stage = :stage AND item_key = ANY(CAST(:keys AS text[]))
                       AND (status = ANY(CAST(:statuses AS text[]))
                            OR status IN ('{DONE}', '{DEAD}') AND {stale_sql("s")})
                       AND (NOT :respect_backoff OR status <> '{FAILED}' OR next_attempt_at <= now())
                       AND {CONCERNS_PROJECTS}
                     ORDER BY id FOR UPDATE SKIP LOCKED) pick
             WHERE w.id = pick.id
            RETURNING w.{LEASE_COLUMNS.replace(", ", ", w.")}
        """)
        params = {
            "stage": stage,
            "keys": list(keys),
            "owner": owner,
            "statuses": statuses,
            "respect_backoff": respect_backoff,
            "projects": None if projects is None else list(projects),
        }
        leases = sorted(
            (_lease(r) for r in self.statements.run(statement, params)), key=lambda x: x.item_id
        )
        return leases, self.why_unclaimed(stage, keys, leases)

    def why_unclaimed(
        self, stage: str, keys: Sequence[str], claimed: Sequence[Lease] = ()
    ) -> list[Unclaimed]:
        """Why each of `keys` that is not among the `claimed` leases was not claimed."""
        taken = {lease.key for lease in claimed}
        keys = [k for k in keys if k not in taken]
        if not keys:
            return []
        statement = sa.text(f"""
            SELECT item_key, status, lease_owner, next_attempt_at, last_error, finished_at, outcome,
                   fingerprint, video_id
              FROM {W} WHERE stage = :stage AND item_key = ANY(CAST(:keys AS text[]))
        """)
        with self.engine.connect() as c:
            found = {
                r.item_key: r for r in c.execute(statement, {"stage": stage, "keys": list(keys)})
            }
        result = []
        for key in keys:
            row = found.get(key)
            result.append(
                Unclaimed(key, None, None, None, None)
                if row is None
                else Unclaimed(
                    key,
                    row.status,
                    row.lease_owner,
                    row.next_attempt_at,
                    row.last_error,
                    row.finished_at,
                    row.outcome,
                    row.fingerprint,
                    row.video_id,
                )
            )
        return result

    def unknown_leases(
        self, stage: str, owner: str, known: Collection[uuid.UUID], keys: Sequence[str] | None
    ) -> list[Lease]:
        """The items of `stage` (among `keys` where given) that run `owner` holds but has not
        begun, other than those whose tokens it `known`s: what a claim of it whose answer was
        lost took (it went through before the connection went)."""
        statement = sa.text(f"""
            SELECT {LEASE_COLUMNS} FROM {W}
             WHERE lease_owner = :owner AND stage = :stage AND status = '{RUNNING}'
               AND started_at IS NULL
               AND (CAST(:keys AS text[]) IS NULL OR item_key = ANY(CAST(:keys AS text[])))
               AND NOT lease_token = ANY(CAST(:known AS uuid[]))
             ORDER BY id
        """)
        params = {
            "stage": stage,
            "owner": owner,
            "known": list(known),
            "keys": None if keys is None else list(keys),
        }
        return [_lease(row) for row in self.statements.run(statement, params)]

    def mark_started(self, lease: Lease) -> None:
        """Note that the holder begins the item now (from here on, losing it costs an attempt).
        Raises LeaseLost when the lease is gone."""
        statement = sa.text(f"""
            UPDATE {W} SET started_at = now() WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING id
        """)
        if not self.statements.run(statement, {"id": lease.item_id, "token": lease.token}):
            raise LeaseLost(lease)

    # --- finishing --------------------------------------------------------------------------

    @contextmanager
    def completing(self, lease: Lease, outcome: dict | None = None) -> Iterator[sa.Connection]:
        """Mark the item done and yield the transaction, in which the caller records its results
        and publishes its files (db/file_changes.py: they settle on the COMMIT's real outcome).
        The row stays locked until commit, so no reaper can take the lease in between; an
        exception in the block rolls everything back. Raises LeaseLost."""
        with committing(
            self.engine, lambda c: self._completed(lease, c), token=lease.token.hex
        ) as c:
            if self._complete([lease], outcome, c):
                raise LeaseLost(lease)
            yield c

    def _completed(self, lease: Lease, conn: sa.Connection) -> bool | None:
        """Whether the completion of `lease`, whose COMMIT lost its connection, went through:
        read back by its token once the row's lock is free (the lost transaction's backend has
        ended). None when the item has moved on since, whichever way."""
        # A backend whose client was cut off holds the row until the server ends its idle
        # transaction (db/engine.py): wait a little longer than that for the lock.
        conn.execute(
            sa.text(
                "SELECT set_config('lock_timeout', (1000 * extract(epoch FROM current_setting("
                "'idle_in_transaction_session_timeout')::interval + interval '5 s'))::bigint::text,"
                " true)"
            )
        )
        row = conn.execute(
            sa.text(f"""SELECT status, lease_token, finished_token FROM {W}
                         WHERE id = :id FOR UPDATE"""),
            {"id": lease.item_id},
        ).one_or_none()
        if row is None:
            return None
        if row.finished_token == lease.token:
            return True
        if row.status == RUNNING and row.lease_token == lease.token:
            return False
        return None

    def complete(self, lease: Lease, outcome: dict | None = None) -> bool:
        """Mark done (nothing else to record); False, and nothing changed, when the lease was lost."""
        return not self.complete_many([lease], outcome)

    def complete_many(self, leases: Sequence[Lease], outcome: dict | None = None) -> list[Lease]:
        """Mark many items done in one statement, the batched counterpart of `claim_next(limit)`
        for work that has nothing else to record. Returns the leases that were lost (unchanged)."""
        if not leases:
            return []
        return self._complete(leases, outcome)

    def _complete(
        self, leases: Sequence[Lease], outcome: dict | None, conn: sa.Connection | None = None
    ) -> list[Lease]:
        params = {**_held(leases), "outcome": _json(outcome)}
        return _lost(leases, (row.id for row in self.statements.run(COMPLETE, params, conn)))

    def fail(
        self,
        lease: Lease,
        error: str,
        *,
        retryable: bool = True,
        then: Callable[[sa.Connection], None] | None = None,
    ) -> FailResult:
        """Record a failure: retry later with back-off, or dead after the last attempt (or at
        once when not retryable). Changes nothing when the lease was lost. `then` runs in the
        same transaction when the failure is recorded (work to queue again first)."""
        statement = sa.text(f"""
            UPDATE {W} SET {fail_set()}
             WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING status, next_attempt_at
        """)
        if then is None:
            return self._record_failure(statement, lease, error, retryable)
        with self.engine.begin() as conn:
            result = self._record_failure(statement, lease, error, retryable, conn)
            if result.applied:
                then(conn)
        return result

    def postpone(self, lease: Lease, reason: str, not_before: datetime | None = None) -> FailResult:
        """The item could not be worked on for a reason that is not its own (the disk is full, its
        host is paused): it is `failed` with `reason` and waits a failure's back-off, or until
        `not_before` when given, but the attempt is not counted, so such a reason never makes it
        dead. Changes nothing when the lease was lost."""
        statement = sa.text(f"""
            UPDATE {W} SET status = '{FAILED}', attempts = greatest(attempts - 1, 0),
                   next_attempt_at = coalesce(CAST(:not_before AS timestamptz), {BACKOFF_AT}),
                   finished_at = NULL, last_error = :error, {CLEAR_LEASE}
             WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING status, next_attempt_at
        """)
        return self._record_failure(
            statement, lease, reason, retryable=True, extra={"not_before": not_before}
        )

    def _record_failure(
        self,
        statement: sa.TextClause,
        lease: Lease,
        error: str,
        retryable: bool,
        conn: sa.Connection | None = None,
        extra: dict | None = None,
    ) -> FailResult:
        params = {
            "id": lease.item_id,
            "token": lease.token,
            **self.statements.fail_params(error, retryable),
            **(extra or {}),
        }
        rows = self.statements.run(statement, params, conn)
        if not rows:
            return FailResult(False, None, None)
        [row] = rows
        return FailResult(True, row.status, row.next_attempt_at if row.status == FAILED else None)

    def block(self, lease: Lease, reason: str) -> bool:
        """A rule says skip this item (e.g. a blocked hashtag): terminal, not a failure."""
        statement = sa.text(f"""
            UPDATE {W} SET status = '{BLOCKED}', last_error = :reason, finished_at = now(), {CLEAR_LEASE}
             WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING id
        """)
        return bool(
            self.statements.run(
                statement, {"id": lease.item_id, "token": lease.token, "reason": redact(reason)}
            )
        )

    def release(self, lease: Lease) -> bool:
        """Give an item back untouched (claimed but never started): the attempt is not counted."""
        return not self.release_many([lease])

    def release_many(self, leases: Sequence[Lease]) -> list[Lease]:
        """`release` for many items in one statement; returns the leases that were lost."""
        if not leases:
            return []
        statement = sa.text(f"""
            UPDATE {W} w SET status = {UNCOUNTED_STATUS}, attempts = greatest(attempts - 1, 0), {CLEAR_LEASE}
              {HELD}
            RETURNING w.id
        """)
        return _lost(leases, (row.id for row in self.statements.run(statement, _held(leases))))

    def retry(
        self,
        *,
        stages: Sequence[str] | None = None,
        project_id: int | None = None,
        statuses: Sequence[str] = (FAILED, DEAD),
    ) -> int:
        """Make failed/dead (or other finished) items pending again with fresh attempts."""
        statement = sa.text(f"""
            UPDATE {W} SET status = '{PENDING}', attempts = 0, next_attempt_at = now(),
                   requested_at = NULL, finished_at = NULL, updated_at = now()
             WHERE status = ANY(CAST(:statuses AS text[]))
               AND (CAST(:stages AS text[]) IS NULL OR stage = ANY(CAST(:stages AS text[])))
               AND {CONCERNS_PROJECTS}
            RETURNING id
        """)
        params = {
            "statuses": [s for s in statuses if s != RUNNING],
            "stages": list(stages) if stages else None,
            "projects": None if project_id is None else [project_id],
        }
        return len(self.statements.run(statement, params))


def _json(value: dict | None) -> str | None:
    import json

    return None if value is None else json.dumps(value, default=str)
