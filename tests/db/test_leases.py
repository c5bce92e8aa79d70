"""Lease operations against a real PostgreSQL (embedded, and external when configured)."""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid

import pytest
import sqlalchemy as sa

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.lease_sql import claim_next_statement
from dataminer_dagster.db.leases import LeaseLost, LeaseStore
from dataminer_dagster.db.run_leases import RunLeases
from dataminer_dagster.db.schema import BLOCKED, DEAD, DONE, FAILED, PENDING, RUNNING
from dataminer_dagster.settings import RetryPolicy
from tests.helpers.pipeline import make_silent

STAGE = "download"


def _seed(store: LeaseStore, n: int, stage: str = STAGE) -> list[str]:
    keys = [f"v{i:06d}" for i in range(n)]
    store.enqueue(stage, keys)
    return keys


def _status(engine, key: str, stage: str = STAGE) -> sa.Row:
    with engine.connect() as c:
        return c.execute(
            sa.text("SELECT * FROM dataminer.work_items WHERE stage = :s AND item_key = :k"),
            {"s": stage, "k": key},
        ).one()


# --- exactly once under concurrency -------------------------------------------------------------


def _claim_until_empty(url: str, owner: str, seed: int) -> int:
    store = LeaseStore(get_engine(url))
    rng = random.Random(seed)
    done = 0
    while leases := store.claim_next(STAGE, owner, rng.randint(1, 12)):
        for lease in leases:
            with store.completing(lease, {"by": owner}) as conn:
                conn.execute(
                    sa.text("INSERT INTO claim_log (item_id, owner) VALUES (:i, :o)"),
                    {"i": lease.item_id, "o": owner},
                )
            done += 1
    return done


def test_eight_processes_claim_every_row_exactly_once(database_url, engine):
    store = LeaseStore(engine)
    _seed(store, 2000)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE claim_log (item_id bigint NOT NULL, owner text NOT NULL)"))

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(8) as pool:
        counts = pool.starmap(_claim_until_empty, [(database_url, f"run-{i}", i) for i in range(8)])
        pool.close()  # the workers end on their own: no terminate(), which signals them
        pool.join()

    assert sum(counts) == 2000
    assert sum(1 for c in counts if c > 0) >= 2, "the claims should be spread over processes"
    with engine.connect() as c:
        logged = c.execute(sa.text("SELECT count(*), count(DISTINCT item_id) FROM claim_log")).one()
        statuses = dict(
            c.execute(sa.text("SELECT status, count(*) FROM dataminer.work_items GROUP BY 1")).all()
        )
    assert tuple(logged) == (2000, 2000)
    assert statuses == {DONE: 2000}


# --- lost leases ---------------------------------------------------------------------------------


def test_reaped_lease_cannot_be_completed_by_its_old_owner(engine):
    store = LeaseStore(engine, RetryPolicy(max_attempts=5, base_delay_s=60))
    _seed(store, 1)
    store.liveness.heartbeat("run-old", "host", 1)
    [old] = store.claim_next(STAGE, "run-old")
    store.mark_started(old)
    make_silent(engine, ["run-old"], longer_than_s=2)  # the old run goes silent

    reaped = store.liveness.reap(stale_after_s=2)
    assert [(r.key, r.owner, r.status) for r in reaped] == [("v000000", "run-old", FAILED)]

    store.liveness.heartbeat("run-new", "host", 2)
    [new], _ = store.claim_keys(STAGE, ["v000000"], "run-new", respect_backoff=False)
    assert new.attempt == 2

    with pytest.raises(LeaseLost), store.completing(old, {"by": "old"}):
        pytest.fail("the block must not run for a lost lease")
    assert store.complete(old, {"by": "old"}) is False
    assert store.fail(old, "late failure").applied is False
    assert store.release(old) is False
    assert store.block(old, "late block") is False
    assert _status(engine, "v000000").status == RUNNING

    assert store.complete(new, {"by": "new"}) is True
    row = _status(engine, "v000000")
    assert (row.status, row.outcome, row.attempts) == (DONE, {"by": "new"}, 2)


def test_failure_inside_completing_rolls_back(engine):
    store = LeaseStore(engine)
    _seed(store, 1)
    [lease] = store.claim_next(STAGE, "run")
    with pytest.raises(RuntimeError), store.completing(lease, {"n": 1}):
        raise RuntimeError("publishing failed")
    assert _status(engine, "v000000").status == RUNNING
    assert store.fail(lease, "publishing failed").status == FAILED


def test_claim_keys_explains_what_it_did_not_claim(engine):
    store = LeaseStore(engine)
    _seed(store, 3)
    store.claim_keys(STAGE, ["v000000"], "run-a")
    [b], _ = store.claim_keys(STAGE, ["v000001"], "run-a")
    store.complete(b)
    leases, unclaimed = store.claim_keys(STAGE, ["v000000", "v000001", "v000002", "nope"], "run-b")
    assert [lease.key for lease in leases] == ["v000002"]
    reasons = {u.key: u.describe() for u in unclaimed}
    assert "already being processed by run run-a" in reasons["v000000"]
    assert "already done" in reasons["v000001"]
    assert "unknown" in reasons["nope"]

    redone, _ = store.claim_keys(STAGE, ["v000001"], "run-b", redo=True)
    assert [(lease.key, lease.attempt) for lease in redone] == [("v000001", 1)]


# --- heartbeats and SIGKILL -----------------------------------------------------------------------


def _hold_leases(url: str, owner: str, keys: list[str], ready, heartbeat_s: float) -> None:
    leases = RunLeases(
        LeaseStore(get_engine(url)), owner, heartbeat_s=heartbeat_s, stale_after_s=4 * heartbeat_s
    )
    leases.start()
    for lease in leases.claim_keys(STAGE, keys)[0]:
        leases.begin(lease)
    ready.set()
    time.sleep(600)  # until killed


def test_killed_run_loses_its_leases_and_live_run_keeps_them(database_url, engine):
    store = LeaseStore(engine, RetryPolicy(max_attempts=3, base_delay_s=0.1))
    _seed(store, 4)
    stale_after = 1.5
    ctx = multiprocessing.get_context("spawn")
    runs = {}
    for owner, keys in (
        ("run-killed", ["v000000", "v000001"]),
        ("run-alive", ["v000002", "v000003"]),
    ):
        ready = ctx.Event()
        proc = ctx.Process(
            target=_hold_leases, args=(database_url, owner, keys, ready, 0.2), daemon=True
        )
        proc.start()
        assert ready.wait(60), f"{owner} did not claim"
        runs[owner] = proc
    try:
        runs["run-killed"].kill()  # SIGKILL: no cleanup, no release
        runs["run-killed"].join()

        assert store.liveness.reap(stale_after) == [], "nothing is stale right after the kill"
        deadline = time.monotonic() + 3 * stale_after
        reaped = []
        while time.monotonic() < deadline:
            reaped += store.liveness.reap(stale_after)
            time.sleep(0.2)

        assert sorted(r.key for r in reaped) == ["v000000", "v000001"]
        for key in ("v000000", "v000001"):
            row = _status(engine, key)
            assert (row.status, row.attempts, row.lease_owner) == (FAILED, 1, None)
            assert "run-killed" in row.last_error
        for key in ("v000002", "v000003"):
            row = _status(engine, key)
            assert (row.status, row.lease_owner) == (RUNNING, "run-alive"), (
                "a live run keeps its leases"
            )
    finally:
        runs["run-alive"].kill()


def test_items_a_dead_run_never_began_go_back_without_counting_an_attempt(engine):
    store = LeaseStore(engine)
    _seed(store, 3)
    store.liveness.heartbeat("run-x", "host", 1)
    first, second, third = store.claim_next(STAGE, "run-x", 3)
    store.mark_started(first)  # the run died working on `first`; it never began the others
    reaped = store.liveness.reap(stale_after_s=3600, finished_runs=["run-x"])
    assert sorted((r.key, r.status) for r in reaped) == [
        ("v000000", FAILED),
        ("v000001", PENDING),
        ("v000002", PENDING),
    ]
    assert [_status(engine, k).attempts for k in ("v000000", "v000001", "v000002")] == [1, 0, 0]
    with pytest.raises(LeaseLost):
        store.mark_started(second)


def test_heartbeat_notices_a_lease_taken_away(engine):
    store = LeaseStore(engine)
    _seed(store, 2)
    leases = RunLeases(store, "run-a", heartbeat_s=60, stale_after_s=120)
    leases.start()
    try:
        first, second = leases.claim_next(STAGE, 2)
        store.liveness.release_run("run-a", "cancelled by a test", count_attempt=False)
        leases.beat()
        assert leases.is_lost(first) and leases.is_lost(second)
        with pytest.raises(LeaseLost):
            leases.check(first)
        with pytest.raises(LeaseLost), leases.completing(first):
            pass
        assert leases.held == [second] or leases.held == []
    finally:
        leases.stop()


def test_finished_run_is_reaped_at_once(engine):
    store = LeaseStore(engine)
    _seed(store, 1)
    store.liveness.heartbeat("run-x", "host", 1)
    [lease] = store.claim_next(STAGE, "run-x")
    store.mark_started(lease)
    assert store.liveness.reap(stale_after_s=3600) == []
    [reaped] = store.liveness.reap(stale_after_s=3600, finished_runs=["run-x"])
    assert reaped.status == FAILED


# --- retries ----------------------------------------------------------------------------------------


def test_failures_back_off_then_end_dead_with_the_last_error(engine):
    base = 0.4
    store = LeaseStore(engine, RetryPolicy(max_attempts=3, base_delay_s=base, max_delay_s=10))
    _seed(store, 1)
    store.liveness.heartbeat("run", "host", 1)
    for attempt in (1, 2, 3):
        [lease] = store.claim_next(STAGE, "run")
        assert lease.attempt == attempt
        before = time.time()
        result = store.fail(lease, f"HTTP 503 on attempt {attempt}")
        if attempt < 3:
            assert result.status == FAILED
            delay = result.next_attempt_at.timestamp() - before
            expected = base * 2 ** (attempt - 1)
            assert 0.5 * expected - 0.05 <= delay <= expected + 0.05
            assert store.claim_next(STAGE, "run") == [], "back-off delays the next claim"
            time.sleep(delay + 0.05)
    assert result.status == DEAD
    row = _status(engine, "v000000")
    assert (row.status, row.attempts, row.last_error) == (DEAD, 3, "HTTP 503 on attempt 3")
    assert store.claim_next(STAGE, "run") == []


def test_permanent_failure_is_dead_at_once_and_block_is_its_own_outcome(engine):
    store = LeaseStore(engine)
    _seed(store, 2)
    first, second = store.claim_next(STAGE, "run", 2)
    assert store.fail(first, "HTTP 404", retryable=False).status == DEAD
    assert store.block(second, "blocked hashtag #gaming")
    assert _status(engine, "v000000").status == DEAD
    assert (_status(engine, "v000001").status, _status(engine, "v000001").last_error) == (
        BLOCKED,
        "blocked hashtag #gaming",
    )


def test_release_does_not_count_the_attempt(engine):
    store = LeaseStore(engine)
    _seed(store, 1)
    [lease] = store.claim_next(STAGE, "run")
    assert store.release(lease)
    row = _status(engine, "v000000")
    assert (row.status, row.attempts) == (PENDING, 0)


def test_batched_completion_and_release_change_only_the_leases_still_held(engine):
    store = LeaseStore(engine)
    _seed(store, 6)
    leases = store.claim_next(STAGE, "run", 6)
    stale = leases[1]
    assert store.release_many([stale]) == []
    [retaken], _ = store.claim_keys(STAGE, [stale.key], "run-other")

    assert store.complete_many(leases[:3], {"batch": 1}) == [stale], "the lost lease is reported"
    assert store.release_many(leases[3:] + [stale]) == [stale]
    rows = {lease.key: _status(engine, lease.key) for lease in leases}
    for lease in (leases[0], leases[2]):
        assert (rows[lease.key].status, rows[lease.key].outcome) == (DONE, {"batch": 1})
    for lease in leases[3:]:
        assert (rows[lease.key].status, rows[lease.key].attempts) == (PENDING, 0)
    assert rows[stale.key].lease_token == retaken.token, "the new owner's lease stands"
    assert store.complete_many([retaken]) == []
    assert store.complete_many([]) == [] and store.release_many([]) == []


def test_claims_take_items_in_due_order_and_skip_those_not_yet_due(engine):
    store = LeaseStore(engine, RetryPolicy(max_attempts=5, base_delay_s=3600))
    _seed(store, 4)
    [first] = store.claim_next(STAGE, "run")
    store.fail(first, "HTTP 503")  # waits an hour
    with engine.begin() as c:  # v000003 has waited longest
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET next_attempt_at = now() - interval '1 minute'
                        WHERE item_key = 'v000003'""")
        )
    assert [lease.key for lease in store.claim_next(STAGE, "run", 1)] == ["v000003"]
    assert [lease.key for lease in store.claim_next(STAGE, "run", 10)] == ["v000001", "v000002"]
    assert store.claim_next(STAGE, "run", 10) == []
    store.enqueue(STAGE, ["v000004", "v000005"])
    assert [lease.key for lease in store.claim_next(STAGE, "run", 1)] == ["v000004"]


def test_claims_use_the_claimable_index_even_when_most_rows_are_pending(engine):
    """With statistics saying nearly every row is claimable, the planner once preferred walking the
    primary key and stepped over every finished row before the first claimable one."""
    store = LeaseStore(engine)
    store.enqueue(STAGE, [f"v{i:06d}" for i in range(20_000)])
    with engine.begin() as c:
        c.execute(sa.text("ANALYZE dataminer.work_items"))
    store.complete_many(store.claim_next(STAGE, "run", 5_000))
    params = {"stage": STAGE, "owner": "run"}
    with engine.begin() as c:  # rolled back: EXPLAIN ANALYZE runs the statement
        plan = c.execute(
            sa.text(f"EXPLAIN (ANALYZE, FORMAT JSON) {claim_next_statement(1).text}"), params
        ).scalar()
        c.rollback()
    scans = list(_plan_nodes(plan[0]["Plan"]))
    claim_scan = next(node for node in scans if node.get("Node Type", "").startswith("Index"))
    assert claim_scan["Index Name"] == "work_items_claimable"
    assert claim_scan.get("Rows Removed by Filter", 0) == 0, "no finished row is visited"


def _plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def test_enqueue_is_idempotent_and_resets_only_what_it_is_told(engine):
    store = LeaseStore(engine)
    assert store.enqueue(STAGE, ["a", "b"]) == 2
    assert store.enqueue(STAGE, ["a", "b"]) == 0
    [lease] = store.claim_keys(STAGE, ["a"], "run")[0]
    store.fail(lease, "boom", retryable=False)
    [running] = store.claim_keys(STAGE, ["b"], "run")[0]
    assert store.enqueue(STAGE, ["a", "b"], reset=[DEAD, RUNNING]) == 1, (
        "running items are never reset"
    )
    assert _status(engine, "a").status == PENDING
    assert _status(engine, "b").lease_token == running.token


def test_retry_makes_dead_items_pending_again(engine):
    store = LeaseStore(engine)
    _seed(store, 3)
    for lease in store.claim_next(STAGE, "run", 2):
        store.fail(lease, "boom", retryable=False)
    assert store.retry(stages=[STAGE]) == 2
    assert store.retry(stages=["frames"]) == 0
    assert {_status(engine, k).status for k in ("v000000", "v000001", "v000002")} == {PENDING}


def test_lease_tokens_are_unique(engine):
    store = LeaseStore(engine)
    _seed(store, 50)
    leases = store.claim_next(STAGE, "run", 50)
    assert len({lease.token for lease in leases}) == 50
    assert all(isinstance(lease.token, uuid.UUID) for lease in leases)


def test_the_migrations_create_exactly_the_schema_of_the_code(engine):
    """db/schema.py (used by the code) and migrations/ (used to create databases) agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from dataminer_dagster.db.schema import SCHEMA, metadata

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "version_table_schema": SCHEMA,
                "include_name": lambda name, type_, parent: type_ != "schema" or name == SCHEMA,
            },
        )
        differences = compare_metadata(context, metadata)
    assert differences == []
