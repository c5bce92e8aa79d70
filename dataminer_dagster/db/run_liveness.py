"""A run's liveness in the claim tables: its heartbeat row (run_heartbeats: when it last beat,
its host, process and process space), and what is done with the leases of a run that stopped (the
reaper's `reap`, the run-failure sensors' `release_run`) or that holds an item far longer than
its stage's items usually take (`long_running`).

Silence is judged only over time the database was up (`lease_sql.silent_since`): a restart, or an
outage the reaper itself met and recorded (`record_reaper_pass`), starts every run's silence
afresh, so that an outage fails no run and consumes no attempt of one that beats again."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.core.process_liveness import process_gone
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.lease_sql import (
    CLEAR_LEASE,
    CONCERNS_PROJECTS,
    REAPER_OUTAGES,
    SIGHTINGS,
    UNCOUNTED_STATUS,
    ClaimStatements,
    H,
    W,
    fail_set,
    silent_since,
)
from dataminer_dagster.db.schema import (
    DONE,
    RUNNING,
)
from dataminer_dagster.settings import LongRunningPolicy


@dataclass(frozen=True)
class Heartbeat:
    age_s: float  # seconds of silence since the run's last beat while the database was up
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


class RunLiveness:
    """The run-level operations of the claim store (`leases.LeaseStore` holds one as `liveness`
    beside its items' operations, on the same statements)."""

    def __init__(self, statements: ClaimStatements):
        self.statements = statements
        self.engine = statements.engine

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
        rows = self.statements.run(statement, params)
        return {row.lease_token for row in rows}

    def heartbeats(self, owners: Sequence[str]) -> dict[str, Heartbeat]:
        """The last heartbeat of each of these runs that ever sent one."""
        if not owners:
            return {}
        statement = sa.text(f"""
            SELECT run_id, extract(epoch FROM now() - {silent_since("heartbeat_at")}) AS age,
                   host, pid, process_space
              FROM {H} WHERE run_id = ANY(CAST(:owners AS text[]))
        """)
        rows = self.statements.run(statement, {"owners": list(owners)})
        return {r.run_id: Heartbeat(float(r.age), r.host, r.pid, r.process_space) for r in rows}

    def in_status_s(self, runs: Sequence[tuple[str, str]]) -> dict[str, float]:
        """Seconds each of these (run id, status) pairs has been seen by the reaper, by the
        database clock and while it was up (0 for a pair seen first now). Their sightings in
        another status are forgotten, and every sighting a week old (of a run finished long
        since)."""
        if not runs:
            return {}
        ids, statuses = [r for r, _ in runs], [s for _, s in runs]
        pairs = "unnest(CAST(:ids AS text[]), CAST(:statuses AS text[])) AS t(run_id, status)"
        with self.engine.begin() as c:
            c.execute(
                sa.text(f"""DELETE FROM {SIGHTINGS} s
                             WHERE s.seen_at < now() - interval '7 days'
                                OR s.run_id = ANY(CAST(:ids AS text[])) AND NOT EXISTS (
                                   SELECT 1 FROM {pairs} WHERE t.run_id = s.run_id
                                                           AND t.status = s.status)"""),
                {"ids": ids, "statuses": statuses},
            )
            c.execute(
                sa.text(f"""INSERT INTO {SIGHTINGS} (run_id, status) SELECT run_id, status
                              FROM {pairs} ON CONFLICT DO NOTHING"""),
                {"ids": ids, "statuses": statuses},
            )
            rows = c.execute(
                sa.text(f"""SELECT run_id, extract(epoch FROM now() - {silent_since("seen_at")})
                                   AS age
                              FROM {SIGHTINGS} WHERE run_id = ANY(CAST(:ids AS text[]))"""),
                {"ids": ids},
            ).all()
        return {r.run_id: float(r.age) for r in rows}

    def record_reaper_pass(self, reaper: str, outage_s: float | None) -> None:
        """A reaper's pass begins: with `outage_s`, the reaper has just come back from an outage
        of that length (it could not reach or write to the database), and no run's silence is
        counted from before now. A write, so that a database whose disk is full stops the pass
        before it judges a run by the heartbeats that could not be written. A reaper's row is
        forgotten a week after its last pass."""
        statement = sa.text(f"""
            WITH gone AS (DELETE FROM {REAPER_OUTAGES}
                           WHERE passed_at < now() - interval '7 days' AND reaper <> :reaper)
            INSERT INTO {REAPER_OUTAGES} AS r (reaper, passed_at, outage_ended_at, outage_s)
            VALUES (:reaper, now(), CASE WHEN CAST(:outage_s AS float8) IS NULL THEN NULL
                                         ELSE now() END, :outage_s)
            ON CONFLICT (reaper) DO UPDATE SET
                passed_at = now(),
                outage_ended_at = coalesce(EXCLUDED.outage_ended_at, r.outage_ended_at),
                outage_s = coalesce(EXCLUDED.outage_s, r.outage_s)
        """)
        self.statements.run(statement, {"reaper": reaper, "outage_s": outage_s})

    def reap(self, stale_after_s: float, finished_runs: Sequence[str] = ()) -> list[Reaped]:
        """Take back the leases of runs that stopped heartbeating while the database was up (or
        that Dagster reports as finished). An item the run had begun counts the attempt: it
        retries with back-off, or is dead; an item it had only claimed goes back uncounted."""
        statement = sa.text(f"""
            WITH stale AS (
                SELECT id, lease_owner FROM {W} w
                 WHERE w.status = '{RUNNING}'
                   AND (w.lease_owner = ANY(CAST(:finished AS text[]))
                        OR NOT EXISTS (SELECT 1 FROM {H} h WHERE h.run_id = w.lease_owner
                                         AND {silent_since("h.heartbeat_at")}
                                             > now() - make_interval(secs => :stale)))
                   FOR UPDATE SKIP LOCKED)
            UPDATE {W} w SET {fail_set("'lease expired: run ' || stale.lease_owner || :error", spare_unstarted=True)}
              FROM stale WHERE w.id = stale.id
            RETURNING w.stage, w.item_key, stale.lease_owner AS owner, w.status
        """)
        params = {
            "stale": stale_after_s,
            "finished": list(finished_runs),
            **self.statements.fail_params(
                " ended or stopped heartbeating while holding this item", True
            ),
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
            for r in self.statements.run(statement, params)
        ]

    def release_run(self, owner: str, reason: str, *, count_attempt: bool) -> int:
        """Release every lease of a run at once (the run failed or was cancelled). With
        `count_attempt`, items the run had begun count a failed attempt; the others never do."""
        if count_attempt:
            set_clause = fail_set(spare_unstarted=True)
            params = {"owner": owner, **self.statements.fail_params(reason, True)}
        else:
            set_clause = f"""status = {UNCOUNTED_STATUS}, attempts = greatest(attempts - 1, 0),
                             last_error = :error, {CLEAR_LEASE}"""
            params = {"owner": owner, "error": redact(reason)}
        statement = sa.text(f"""
            UPDATE {W} SET {set_clause} WHERE lease_owner = :owner AND status = '{RUNNING}' RETURNING id
        """)
        return len(self.statements.run(statement, params))
