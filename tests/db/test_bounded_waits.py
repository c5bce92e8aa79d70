"""No wait on the database outlives a lease (db/engine.py `bounded_waits`), and a run whose
heartbeats stop getting through stops touching its items' files (db/run_leases.py)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import sqlalchemy as sa

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseFenced, LeaseStore
from dataminer_dagster.db.run_leases import FENCE_AT, RunLeases
from dataminer_dagster.settings import LeasePolicy

# A lease that goes stale after 4 s: locks are waited for 1 s at most, an idle transaction is
# ended after 2 s, a statement after 4 s.
LEASE = LeasePolicy(heartbeat_s=1, stale_after_s=4)
STAGE = "download"


@pytest.fixture
def product_engine(database_url) -> sa.Engine:
    """The product's engine for this test's database, sized from LEASE."""
    return get_engine(database_url, lease=LEASE)


@pytest.fixture
def other_session(database_url):
    """A plain connection of another process's kind, with no timeouts of its own."""
    engine = sa.create_engine(database_url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        yield conn
    engine.dispose()


def _item(engine: sa.Engine) -> int:
    store = LeaseStore(engine)
    store.enqueue(STAGE, ["v0"])
    with engine.connect() as c:
        return c.execute(sa.text("SELECT id FROM dataminer.work_items")).scalar_one()


def test_a_statement_waiting_for_a_locked_row_gives_up_well_within_a_lease(
    product_engine, other_session
):
    item = _item(product_engine)
    other_session.begin()
    other_session.execute(
        sa.text("SELECT 1 FROM dataminer.work_items WHERE id = :id FOR UPDATE"), {"id": item}
    )
    releaser = threading.Timer(3 * LEASE.stale_after_s, other_session.rollback)
    releaser.start()  # without a lock timeout, the update would go through once this ran
    try:
        started = time.monotonic()
        with (
            pytest.raises(sa.exc.OperationalError, match="lock timeout"),
            product_engine.begin() as conn,
        ):
            conn.execute(
                sa.text("UPDATE dataminer.work_items SET attempts = 9 WHERE id = :id"),
                {"id": item},
            )
        assert time.monotonic() - started < LEASE.stale_after_s / 2
    finally:
        releaser.join()


def test_a_session_left_idle_in_a_transaction_is_ended_and_its_row_lock_freed(
    product_engine, other_session
):
    item = _item(product_engine)
    with product_engine.connect() as conn:
        conn.begin()
        conn.execute(
            sa.text("SELECT 1 FROM dataminer.work_items WHERE id = :id FOR UPDATE"), {"id": item}
        )
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        time.sleep(LEASE.stale_after_s * 0.75)  # its client cut off, mid-transaction
        alive = other_session.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).scalar_one()
        assert alive == 0, "the server ended the idle transaction's session"
        other_session.execute(sa.text("SET lock_timeout = '100ms'"))
        other_session.execute(
            sa.text("UPDATE dataminer.work_items SET attempts = 9 WHERE id = :id"), {"id": item}
        )
        with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction timeout"):
            conn.execute(sa.text("SELECT 1"))


def test_a_statement_runs_no_longer_than_a_lease_lives(product_engine):
    with (
        pytest.raises(sa.exc.OperationalError, match="statement timeout"),
        product_engine.connect() as conn,
    ):
        conn.execute(sa.text("SELECT pg_sleep(:s)"), {"s": LEASE.stale_after_s + 2})


def test_a_server_that_accepts_but_never_answers_fails_the_connect_in_seconds():
    silent = socket.create_server(("127.0.0.1", 0))
    port = silent.getsockname()[1]
    url = f"postgresql+psycopg://dataminer@127.0.0.1:{port}/nothing"
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            with get_engine(url, lease=LEASE).connect():
                outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - asserted below
            outcome.append(error)

    try:
        connecting = threading.Thread(target=connect, daemon=True)
        started = time.monotonic()
        connecting.start()
        connecting.join(timeout=15)
        assert outcome, "the connect is still waiting"
        assert isinstance(outcome[0], sa.exc.OperationalError)
        assert time.monotonic() - started < LEASE.stale_after_s
    finally:
        silent.close()


def _within(seconds: float, call):
    """`call()`'s result; fails the test when it takes longer than `seconds`."""
    result = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert result, f"still waiting after {seconds} s"
    return result[0]


def test_a_run_whose_heartbeats_stop_getting_through_stops_touching_files(
    product_engine, other_session
):
    store = LeaseStore(product_engine)
    store.enqueue(STAGE, ["v0"])
    leases = RunLeases(
        store, "run-a", heartbeat_s=LEASE.heartbeat_s, stale_after_s=LEASE.stale_after_s
    )
    leases.start()
    try:
        [lease] = leases.claim_next(STAGE, 1)
        leases.check(lease)
        # Its heartbeat row locked by another session: every beat now waits a lock timeout and
        # fails, as beats do that cannot reach the database.
        other_session.begin()
        other_session.execute(
            sa.text("SELECT 1 FROM dataminer.run_heartbeats WHERE run_id = 'run-a' FOR UPDATE")
        )
        time.sleep(FENCE_AT * LEASE.stale_after_s + 0.5)
        assert _within(0.5, lambda: leases.held) == [lease], "a stuck beat holds up nothing"

        # Fenced: a check waits for a beat, and after another lease's life without one says why.
        started = time.monotonic()
        with pytest.raises(LeaseFenced, match="no heartbeat of this run has reached the database"):
            leases.check(lease)
        assert time.monotonic() - started >= LEASE.stale_after_s - 0.5

        # An outage shorter than that: the check waits until a beat gets through, the lease
        # still the run's, and the work goes on.
        beats_again = threading.Timer(1.0, other_session.rollback)
        beats_again.start()
        try:
            leases.check(lease)
        finally:
            beats_again.join()
        assert leases.silent_s() < FENCE_AT * LEASE.stale_after_s
    finally:
        leases.stop()
