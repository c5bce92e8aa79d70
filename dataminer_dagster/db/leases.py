"""Lease operations on work items: the only code that changes a work item's status.

Every operation is one conditional SQL statement. A lease belongs to a Dagster run (`lease_owner`)
and is identified by a random `lease_token`; completing, failing or releasing checks the token, so a
run that lost its lease (reaped, or released by the run-failure sensor) changes nothing and is told
so. Liveness is per run: one `run_heartbeats` row, refreshed by the run's resource thread.
Errors are stored redacted (core/redact.py): a video URL's password or token never reaches
`last_error`, nor what reads it (status, logs, project errors).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from psycopg.rows import namedtuple_row

from dataminer_dagster.assets import VIDEO_STAGES
from dataminer_dagster.core.process_liveness import process_gone
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.schema import (
    BLOCKED,
    CLAIMABLE,
    DEAD,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SCHEMA,
    current_fingerprint_sql,
    stale_sql,
)
from dataminer_dagster.settings import LongRunningPolicy, RetryPolicy

_log = logging.getLogger(__name__)

W = f"{SCHEMA}.work_items"
H = f"{SCHEMA}.run_heartbeats"


class LeaseLost(Exception):
    """The lease was taken from this run (reaped or released); its work must not be published."""

    def __init__(self, lease: Lease):
        self.lease = lease
        super().__init__(
            f"{lease.stage} {lease.key}: lease lost (another run owns this item now, or it was "
            "released after this run stopped heartbeating); this run's result is discarded"
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


@dataclass(frozen=True)
class Heartbeat:
    age_s: float  # seconds since the run's last beat, by the database clock
    host: str
    pid: int
    process_space: str | None = None  # where `pid` can be looked up; None: judged by silence only

    def process_gone(self) -> bool:
        """The process that sent this beat is known to be gone (looked up from its own process
        space; from elsewhere this is never known, and False)."""
        return process_gone(self.pid, self.process_space, beat_age_s=self.age_s)


@dataclass(frozen=True)
class LongRunning:
    """A lease held far longer than its stage's items usually take."""

    stage: str
    key: str
    owner: str
    token: uuid.UUID
    held_s: float  # since the item was begun
    usual_s: float | None  # median of the stage's recent items; None: none finished yet

    def describe(self) -> str:
        from dataminer_dagster.core.progress import format_seconds

        usual = (
            f"its stage's items usually take {format_seconds(self.usual_s)}"
            if self.usual_s is not None
            else f"no {self.stage} item has finished yet"
        )
        return (
            f"{self.stage} {self.key}: running for {format_seconds(self.held_s)} in run "
            f"{self.owner}; {usual}"
        )


@dataclass(frozen=True)
class Reaped:
    stage: str
    key: str
    owner: str
    status: str  # failed or dead


_LEASE_COLUMNS = (
    "id, stage, item_key, lease_token, lease_owner, attempts, max_attempts, project_id, video_id, "
    "fingerprint"
)

_CLEAR_LEASE = (
    "lease_owner = NULL, lease_token = NULL, leased_at = NULL, started_at = NULL, requested_at = NULL, "
    "updated_at = now()"
)
# Completion keeps `started_at`: with `finished_at` it tells how long the item took (the usual
# duration of a stage, against which long-running leases are judged). A claim clears it.
_CLEAR_LEASE_KEEP_START = _CLEAR_LEASE.replace("started_at = NULL, ", "")


# When an item that failed is tried again: exponential back-off in its attempts, with jitter.
_BACKOFF_AT = (
    "now() + make_interval(secs => least(:max_delay, "
    ":base_delay * power(2, greatest(attempts - 1, 0))) * (0.5 + random() * 0.5))"
)


# Failing an item: back to `failed` with exponential back-off and jitter, or `dead` once it has
# used its attempts (or at once when the failure is permanent). Shared by fail, reap and release_run.
def _fail_set(error_sql: str = ":error", *, spare_unstarted: bool = False) -> str:
    """SET clause of a failure. With `spare_unstarted`, items the run never began (started_at
    NULL) go back as if released: no attempt counted, no back-off."""
    last = ":retryable AND attempts < max_attempts"
    status = f"CASE WHEN {last} THEN '{FAILED}' ELSE '{DEAD}' END"
    attempts = "attempts"
    next_at = _BACKOFF_AT
    finished = f"CASE WHEN {last} THEN NULL ELSE now() END"
    if spare_unstarted:
        status = f"CASE WHEN started_at IS NULL THEN {_UNCOUNTED_STATUS} ELSE {status} END"
        attempts = "CASE WHEN started_at IS NULL THEN greatest(attempts - 1, 0) ELSE attempts END"
        next_at = f"CASE WHEN started_at IS NULL THEN now() ELSE {next_at} END"
        finished = f"CASE WHEN started_at IS NULL THEN NULL ELSE {finished} END"
    return f"""status = {status}, attempts = {attempts}, next_attempt_at = {next_at},
               finished_at = {finished}, last_error = {error_sql}, {_CLEAR_LEASE}"""


# Giving an item back uncounted: `failed` if an earlier attempt failed (it keeps its error), else
# `pending`.
_UNCOUNTED_STATUS = f"CASE WHEN attempts > 1 THEN '{FAILED}' ELSE '{PENDING}' END"


# Items that concern the projects `:projects` (all when it is NULL): their own, and their videos'
# downloads, extractions and backups.
CONCERNS_PROJECTS = f"""(CAST(:projects AS int[]) IS NULL
    OR project_id = ANY(CAST(:projects AS int[]))
    OR (stage IN ({", ".join(f"'{stage}'" for stage in VIDEO_STAGES)})
        AND video_id IN (SELECT video_id FROM {SCHEMA}.project_videos
                          WHERE project_id = ANY(CAST(:projects AS int[])))))"""


# A claim records the config its work is done with (the project's fingerprint of the stage, read
# in the claim itself: a config changed after it makes the item stale, never the other way).
_RECORD_FINGERPRINT = f"fingerprint = {current_fingerprint_sql('w')}"


# The hot statements, also run as they are by bench/claims.py.
@functools.lru_cache(maxsize=32)
def claim_next_statement(limit: int) -> sa.TextClause:
    """Claim up to `limit` items of `:stage` for `:owner`. The limit is part of the text, so that
    the plan PostgreSQL keeps for the prepared statement is the right one: with a `$n` limit it
    estimates a tenth of the table, finds that plan dear and plans the statement again every time.
    `id = ANY(ARRAY(...))` keeps the plan an index lookup whatever the limit."""
    return sa.text(f"""
        UPDATE {W} w
           SET status = '{RUNNING}', lease_owner = :owner, lease_token = gen_random_uuid(),
               leased_at = now(), started_at = NULL, attempts = w.attempts + 1, updated_at = now(),
               {_RECORD_FINGERPRINT}
         WHERE w.id = ANY(ARRAY(
                SELECT id FROM {W}
                 WHERE stage = :stage AND status IN ('{PENDING}', '{FAILED}') AND next_attempt_at <= now()
                 ORDER BY next_attempt_at, id LIMIT {int(limit)} FOR UPDATE SKIP LOCKED))
        RETURNING {_LEASE_COLUMNS}
    """)


# The rows of the given leases (`:ids`, `:tokens`) that their holder still owns. Tokens are unique,
# so a row whose token is among the tokens is the row that token was issued for.
_HELD = f"""WHERE w.id = ANY(CAST(:ids AS bigint[])) AND w.lease_token = ANY(CAST(:tokens AS uuid[]))
               AND w.status = '{RUNNING}'"""

# An item claimed under a config of its project since replaced (stale: its fingerprint differs)
# completes as pending, with fresh attempts: its results stand until it is done again.
_STALE = stale_sql("w")
COMPLETE = sa.text(f"""
    UPDATE {W} w SET status = CASE WHEN {_STALE} THEN '{PENDING}' ELSE '{DONE}' END,
           attempts = CASE WHEN {_STALE} THEN 0 ELSE w.attempts END,
           next_attempt_at = CASE WHEN {_STALE} THEN now() ELSE w.next_attempt_at END,
           outcome = CAST(:outcome AS jsonb), last_error = NULL,
           finished_at = CASE WHEN {_STALE} THEN NULL ELSE now() END, {_CLEAR_LEASE_KEEP_START}
      {_HELD}
    RETURNING w.id
""")


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


@functools.lru_cache(maxsize=64)
def _driver_sql(text: str, dialect: sa.Dialect) -> str:
    """A statement's text in the driver's parameter style."""
    return sa.text(text).compile(dialect=dialect).string


class LeaseStore:
    def __init__(self, engine: sa.Engine, retry: RetryPolicy | None = None):
        self.engine = engine
        self.policy = retry or RetryPolicy()
        # Each operation is one statement: run it in autocommit, one round trip instead of three
        # (BEGIN, statement, COMMIT). `completing` keeps a real transaction for the caller's writes.
        self._autocommit = get_engine(
            engine.url.render_as_string(hide_password=False), autocommit=True
        )

    def _run(
        self, statement: sa.TextClause, params: dict, conn: sa.Connection | None = None
    ) -> list:
        """Run one operation's statement and return its rows (named tuples), in the caller's
        transaction `conn`, or else on its own. On its own it goes straight to the driver on a
        pooled autocommit connection: SQLAlchemy's execution layer costs more than the statement
        itself when many claimers share a machine (bench/claims.py)."""
        if conn is not None:
            return conn.execute(statement, params).all()
        pooled = self._autocommit.raw_connection()  # the pool's pre-ping survives a restart
        try:
            cursor = pooled.driver_connection.cursor(row_factory=namedtuple_row)
            with cursor:
                cursor.execute(_driver_sql(statement.text, self._autocommit.dialect), params)
                return cursor.fetchall() if cursor.description else []
        finally:
            pooled.close()

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
            "max_attempts": self.policy.max_attempts,
            "requested": requested,
        }
        return len(self._run(statement, params, conn))

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
            "max_attempts": self.policy.max_attempts,
            "status": status,
            "reason": redact(reason),
            "outcome": _json(outcome),
        }
        return bool(self._run(statement, params, conn))

    # --- claiming ---------------------------------------------------------------------------

    def claim_next(self, stage: str, owner: str, limit: int = 1) -> list[Lease]:
        """Claim up to `limit` claimable items of `stage`, skipping locked rows: the longest due
        first, and items due at the same time in the order they were queued."""
        rows = self._run(claim_next_statement(limit), {"stage": stage, "owner": owner})
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
                   finished_at = NULL, {_RECORD_FINGERPRINT},
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
            RETURNING w.{_LEASE_COLUMNS.replace(", ", ", w.")}
        """)
        params = {
            "stage": stage,
            "keys": list(keys),
            "owner": owner,
            "statuses": statuses,
            "respect_backoff": respect_backoff,
            "projects": None if projects is None else list(projects),
        }
        leases = sorted((_lease(r) for r in self._run(statement, params)), key=lambda x: x.item_id)
        claimed = {lease.key for lease in leases}
        missing = [k for k in keys if k not in claimed]
        return leases, self._why_unclaimed(stage, missing)

    def _why_unclaimed(self, stage: str, keys: Sequence[str]) -> list[Unclaimed]:
        if not keys:
            return []
        statement = sa.text(f"""
            SELECT item_key, status, lease_owner, next_attempt_at, last_error, finished_at, outcome
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
                )
            )
        return result

    # --- liveness ---------------------------------------------------------------------------

    def heartbeat(
        self, owner: str, host: str, pid: int, process_space: str | None = None
    ) -> set[uuid.UUID]:
        """Prove that run `owner` is alive (process `pid` of `process_space`, on `host`);
        returns the tokens of the leases it still holds."""
        statement = sa.text(f"""
            WITH beat AS (
                INSERT INTO {H} (run_id, host, pid, process_space)
                VALUES (:owner, :host, :pid, :space)
                ON CONFLICT (run_id) DO UPDATE SET heartbeat_at = now(), host = EXCLUDED.host,
                                                   pid = EXCLUDED.pid,
                                                   process_space = EXCLUDED.process_space
                RETURNING run_id)
            SELECT w.lease_token FROM {W} w JOIN beat ON w.lease_owner = beat.run_id
             WHERE w.status = '{RUNNING}'
        """)
        params = {"owner": owner, "host": host, "pid": pid, "space": process_space}
        rows = self._run(statement, params)
        return {row.lease_token for row in rows}

    def heartbeats(self, owners: Sequence[str]) -> dict[str, Heartbeat]:
        """The last heartbeat of each of these runs that ever sent one."""
        if not owners:
            return {}
        statement = sa.text(f"""
            SELECT run_id, extract(epoch FROM now() - heartbeat_at) AS age, host, pid, process_space
              FROM {H} WHERE run_id = ANY(CAST(:owners AS text[]))
        """)
        rows = self._run(statement, {"owners": list(owners)})
        return {r.run_id: Heartbeat(float(r.age), r.host, r.pid, r.process_space) for r in rows}

    def mark_started(self, lease: Lease) -> None:
        """Note that the holder begins the item now (from here on, losing it costs an attempt).
        Raises LeaseLost when the lease is gone."""
        statement = sa.text(f"""
            UPDATE {W} SET started_at = now() WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING id
        """)
        if not self._run(statement, {"id": lease.item_id, "token": lease.token}):
            raise LeaseLost(lease)

    # --- finishing --------------------------------------------------------------------------

    @contextmanager
    def completing(self, lease: Lease, outcome: dict | None = None) -> Iterator[sa.Connection]:
        """Mark the item done and yield the transaction, in which the caller records its results
        and publishes its files. The row stays locked until commit, so no reaper can take the
        lease in between; an exception in the block rolls everything back. Raises LeaseLost."""
        with self.engine.begin() as c:
            if self._complete([lease], outcome, c):
                raise LeaseLost(lease)
            yield c

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
        return _lost(leases, (row.id for row in self._run(COMPLETE, params, conn)))

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
            UPDATE {W} SET {_fail_set()}
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
                   next_attempt_at = coalesce(CAST(:not_before AS timestamptz), {_BACKOFF_AT}),
                   finished_at = NULL, last_error = :error, {_CLEAR_LEASE}
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
            **self._fail_params(error, retryable),
            **(extra or {}),
        }
        rows = self._run(statement, params, conn)
        if not rows:
            return FailResult(False, None, None)
        [row] = rows
        return FailResult(True, row.status, row.next_attempt_at if row.status == FAILED else None)

    def block(self, lease: Lease, reason: str) -> bool:
        """A rule says skip this item (e.g. a blocked hashtag): terminal, not a failure."""
        statement = sa.text(f"""
            UPDATE {W} SET status = '{BLOCKED}', last_error = :reason, finished_at = now(), {_CLEAR_LEASE}
             WHERE id = :id AND lease_token = :token AND status = '{RUNNING}'
            RETURNING id
        """)
        return bool(
            self._run(
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
            UPDATE {W} w SET status = {_UNCOUNTED_STATUS}, attempts = greatest(attempts - 1, 0), {_CLEAR_LEASE}
              {_HELD}
            RETURNING w.id
        """)
        return _lost(leases, (row.id for row in self._run(statement, _held(leases))))

    # --- recovery ---------------------------------------------------------------------------

    def reap(self, stale_after_s: float, finished_runs: Sequence[str] = ()) -> list[Reaped]:
        """Take back the leases of runs that stopped heartbeating (or that Dagster reports as
        finished). An item the run had begun counts the attempt: it retries with back-off, or is
        dead; an item it had only claimed goes back uncounted."""
        statement = sa.text(f"""
            WITH stale AS (
                SELECT id, lease_owner FROM {W} w
                 WHERE w.status = '{RUNNING}'
                   AND (w.lease_owner = ANY(CAST(:finished AS text[]))
                        OR NOT EXISTS (SELECT 1 FROM {H} h WHERE h.run_id = w.lease_owner
                                         AND h.heartbeat_at > now() - make_interval(secs => :stale)))
                   FOR UPDATE SKIP LOCKED)
            UPDATE {W} w SET {_fail_set("'lease expired: run ' || stale.lease_owner || :error", spare_unstarted=True)}
              FROM stale WHERE w.id = stale.id
            RETURNING w.stage, w.item_key, stale.lease_owner AS owner, w.status
        """)
        params = {
            "stale": stale_after_s,
            "finished": list(finished_runs),
            **self._fail_params(" ended or stopped heartbeating while holding this item", True),
        }
        with self.engine.begin() as c:
            rows = c.execute(statement, params).all()
            c.execute(
                sa.text(f"""DELETE FROM {H} h WHERE h.heartbeat_at < now() - interval '1 day'
                             AND NOT EXISTS (SELECT 1 FROM {W} w WHERE w.lease_owner = h.run_id)""")
            )
        return [Reaped(r.stage, r.item_key, r.owner, r.status) for r in rows]

    def lease_owners(self) -> list[str]:
        """Runs that hold at least one lease."""
        with self.engine.connect() as c:
            return list(
                c.execute(
                    sa.text(f"SELECT DISTINCT lease_owner FROM {W} WHERE status = '{RUNNING}'")
                ).scalars()
            )

    def long_running(
        self, policy: LongRunningPolicy, project_id: int | None = None
    ) -> list[LongRunning]:
        """Begun items held longer than `policy.factor` times the median time of their stage's
        last 200 finished items (at least `policy.min_s`), or than `policy.without_history_s`
        when none has finished yet; with `project_id`, those that concern that project."""
        statement = sa.text(f"""
            WITH running AS (
                SELECT stage, item_key, lease_owner, lease_token,
                       extract(epoch FROM now() - started_at) AS held_s
                  FROM {W} WHERE status = '{RUNNING}' AND started_at IS NOT NULL
                   AND {CONCERNS_PROJECTS}),
            usual AS (
                SELECT s.stage, (
                    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY d) FROM (
                        SELECT extract(epoch FROM x.finished_at - x.started_at) AS d FROM {W} x
                         WHERE x.stage = s.stage AND x.status = '{DONE}'
                           AND x.started_at IS NOT NULL
                         ORDER BY x.finished_at DESC LIMIT 200) recent) AS median_s
                  FROM (SELECT DISTINCT stage FROM running) s)
            SELECT r.*, u.median_s FROM running r JOIN usual u ON u.stage = r.stage
             WHERE r.held_s > CASE WHEN u.median_s IS NULL THEN :without
                                   ELSE greatest(:min_s, :factor * u.median_s) END
             ORDER BY r.held_s DESC
        """)
        params = {
            "without": policy.without_history_s,
            "min_s": policy.min_s,
            "factor": policy.factor,
            "projects": None if project_id is None else [project_id],
        }
        return [
            LongRunning(
                r.stage,
                r.item_key,
                r.lease_owner,
                r.lease_token,
                float(r.held_s),
                None if r.median_s is None else float(r.median_s),
            )
            for r in self._run(statement, params)
        ]

    def release_run(self, owner: str, reason: str, *, count_attempt: bool) -> int:
        """Release every lease of a run at once (the run failed or was cancelled). With
        `count_attempt`, items the run had begun count a failed attempt; the others never do."""
        if count_attempt:
            set_clause = _fail_set(spare_unstarted=True)
            params = {"owner": owner, **self._fail_params(reason, True)}
        else:
            set_clause = f"""status = {_UNCOUNTED_STATUS}, attempts = greatest(attempts - 1, 0),
                             last_error = :error, {_CLEAR_LEASE}"""
            params = {"owner": owner, "error": redact(reason)}
        statement = sa.text(f"""
            UPDATE {W} SET {set_clause} WHERE lease_owner = :owner AND status = '{RUNNING}' RETURNING id
        """)
        return len(self._run(statement, params))

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
        return len(self._run(statement, params))

    # --- helpers ----------------------------------------------------------------------------

    def _fail_params(self, error: str, retryable: bool) -> dict:
        return {
            "error": redact(error),
            "retryable": retryable,
            "base_delay": self.policy.base_delay_s,
            "max_delay": self.policy.max_delay_s,
        }


def _json(value: dict | None) -> str | None:
    import json

    return None if value is None else json.dumps(value, default=str)
