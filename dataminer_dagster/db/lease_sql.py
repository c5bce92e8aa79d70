"""The SQL text that the claim tables' operations share (work_items and run_heartbeats): the
lease columns, how a lease is cleared, how a failure is set (back-off, dead, uncounted), the hot
statements bench/claims.py runs as they are, and `ClaimStatements`, which runs one operation's
statement. `leases.LeaseStore` (a work item's lease) and `run_liveness.RunLiveness` (a run's
heartbeat and what happens when it stops) each hold the one `ClaimStatements` they share."""

from __future__ import annotations

import functools

import sqlalchemy as sa
from psycopg.rows import namedtuple_row

from dataminer_dagster.assets import VIDEO_STAGES
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.schema import (
    DEAD,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    SCHEMA,
    current_fingerprint_sql,
    stale_sql,
)
from dataminer_dagster.settings import RetryPolicy

W = f"{SCHEMA}.work_items"
H = f"{SCHEMA}.run_heartbeats"
SIGHTINGS = f"{SCHEMA}.run_sightings"
REAPER_OUTAGES = f"{SCHEMA}.reaper_outages"


def silent_since(moment: str) -> str:
    """From when the reaper counts a run's silence (or a run's wait in a status) that began at
    `moment`: not before the database last started (a restart), nor before the end of the last
    outage a reaper recorded (it could not reach the database; db/outages.py). Time the database
    was away counts against no run."""
    return (
        f"greatest({moment}, pg_postmaster_start_time(), "
        f"(SELECT max(outage_ended_at) FROM {REAPER_OUTAGES}))"
    )


LEASE_COLUMNS = (
    "id, stage, item_key, lease_token, lease_owner, attempts, max_attempts, project_id, video_id, "
    "fingerprint"
)

CLEAR_LEASE = (
    "lease_owner = NULL, lease_token = NULL, leased_at = NULL, started_at = NULL, requested_at = NULL, "
    "updated_at = now()"
)
# Completion keeps `started_at`: with `finished_at` it tells how long the item took (the usual
# duration of a stage, against which long-running leases are judged). A claim clears it.
CLEAR_LEASE_KEEP_START = CLEAR_LEASE.replace("started_at = NULL, ", "")


# When an item that failed is tried again: exponential back-off in its attempts, with jitter.
BACKOFF_AT = (
    "now() + make_interval(secs => least(:max_delay, "
    ":base_delay * power(2, greatest(attempts - 1, 0))) * (0.5 + random() * 0.5))"
)


# Failing an item: back to `failed` with exponential back-off and jitter, or `dead` once it has
# used its attempts (or at once when the failure is permanent). Shared by fail, reap and release_run.
def fail_set(error_sql: str = ":error", *, spare_unstarted: bool = False) -> str:
    """SET clause of a failure. With `spare_unstarted`, items the run never began (started_at
    NULL) go back as if released: no attempt counted, no back-off."""
    last = ":retryable AND attempts < max_attempts"
    status = f"CASE WHEN {last} THEN '{FAILED}' ELSE '{DEAD}' END"
    attempts = "attempts"
    next_at = BACKOFF_AT
    finished = f"CASE WHEN {last} THEN NULL ELSE now() END"
    if spare_unstarted:
        status = f"CASE WHEN started_at IS NULL THEN {UNCOUNTED_STATUS} ELSE {status} END"
        attempts = "CASE WHEN started_at IS NULL THEN greatest(attempts - 1, 0) ELSE attempts END"
        next_at = f"CASE WHEN started_at IS NULL THEN now() ELSE {next_at} END"
        finished = f"CASE WHEN started_at IS NULL THEN NULL ELSE {finished} END"
    return f"""status = {status}, attempts = {attempts}, next_attempt_at = {next_at},
               finished_at = {finished}, last_error = {error_sql}, {CLEAR_LEASE}"""


# Giving an item back uncounted: `failed` if an earlier attempt failed (it keeps its error), else
# `pending`.
UNCOUNTED_STATUS = f"CASE WHEN attempts > 1 THEN '{FAILED}' ELSE '{PENDING}' END"


# Items that concern the projects `:projects` (all when it is NULL): their own, and their videos'
# downloads, extractions and backups.
CONCERNS_PROJECTS = f"""(CAST(:projects AS int[]) IS NULL
    OR project_id = ANY(CAST(:projects AS int[]))
    OR (stage IN ({", ".join(f"'{stage}'" for stage in VIDEO_STAGES)})
        AND video_id IN (SELECT video_id FROM {SCHEMA}.project_videos
                          WHERE project_id = ANY(CAST(:projects AS int[])))))"""


# A claim records the config its work is done with (the project's fingerprint of the stage, read
# in the claim itself: a config changed after it makes the item stale, never the other way).
RECORD_FINGERPRINT = f"fingerprint = {current_fingerprint_sql('w')}"


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
               {RECORD_FINGERPRINT}
         WHERE w.id = ANY(ARRAY(
                SELECT id FROM {W}
                 WHERE stage = :stage AND status IN ('{PENDING}', '{FAILED}') AND next_attempt_at <= now()
                 ORDER BY next_attempt_at, id LIMIT {int(limit)} FOR UPDATE SKIP LOCKED))
        RETURNING {LEASE_COLUMNS}
    """)


# The rows of the given leases (`:ids`, `:tokens`) that their holder still owns. Tokens are unique,
# so a row whose token is among the tokens is the row that token was issued for.
HELD = f"""WHERE w.id = ANY(CAST(:ids AS bigint[])) AND w.lease_token = ANY(CAST(:tokens AS uuid[]))
               AND w.status = '{RUNNING}'"""

# An item claimed under a config of its project since replaced (stale: its fingerprint differs)
# completes as pending, with fresh attempts: its results stand until it is done again.
STALE = stale_sql("w")
COMPLETE = sa.text(f"""
    UPDATE {W} w SET status = CASE WHEN {STALE} THEN '{PENDING}' ELSE '{DONE}' END,
           attempts = CASE WHEN {STALE} THEN 0 ELSE w.attempts END,
           next_attempt_at = CASE WHEN {STALE} THEN now() ELSE w.next_attempt_at END,
           outcome = CAST(:outcome AS jsonb), last_error = NULL,
           finished_at = CASE WHEN {STALE} THEN NULL ELSE now() END,
           finished_token = w.lease_token, {CLEAR_LEASE_KEEP_START}
      {HELD}
    RETURNING w.id
""")


@functools.lru_cache(maxsize=64)
def driver_sql(text: str, dialect: sa.Dialect) -> str:
    """A statement's text in the driver's parameter style."""
    return sa.text(text).compile(dialect=dialect).string


class ClaimStatements:
    """Runs the claim tables' statements, on the caller's transaction or on a pooled autocommit
    connection, under one retry policy."""

    def __init__(self, engine: sa.Engine, retry: RetryPolicy | None = None):
        self.engine = engine
        self.policy = retry or RetryPolicy()
        # Each operation is one statement: run it in autocommit, one round trip instead of three
        # (BEGIN, statement, COMMIT). `completing` keeps a real transaction for the caller's writes.
        self._autocommit = get_engine(
            engine.url.render_as_string(hide_password=False), autocommit=True
        )

    def run(
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
                cursor.execute(driver_sql(statement.text, self._autocommit.dialect), params)
                return cursor.fetchall() if cursor.description else []
        finally:
            pooled.close()

    def fail_params(self, error: str, retryable: bool) -> dict:
        return {
            "error": redact(error),
            "retryable": retryable,
            "base_delay": self.policy.base_delay_s,
            "max_delay": self.policy.max_delay_s,
        }
