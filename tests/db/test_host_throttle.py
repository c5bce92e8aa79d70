"""The host throttle in the claim database (db/host_pauses.py behind db/shared_throttle.py):
pauses honour Retry-After or grow exponentially and are never shortened, request turns are
exclusive across connections, download slots are limited per host across runs and freed by a stale
run. Lengths are read from the database (`paused_until - paused_at`, both set by one statement),
never timed."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from dataminer_dagster.acquisition.errors import HostPaused, ThrottleSignal
from dataminer_dagster.acquisition.politeness import PausePolicy
from dataminer_dagster.db.host_pauses import active_pauses
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.shared_throttle import SharedThrottle

RATE_LIMITED = ThrottleSignal("rate limited", "HTTP 429")
BOT_CHECK = ThrottleSignal("bot check", "HTTP 403: the page asks to prove this is not a bot")


def throttle(engine, run_id="run-1", *, base_s=10.0, max_s=35.0, **kwargs) -> SharedThrottle:
    return SharedThrottle(
        engine,
        run_id=run_id,
        policy=PausePolicy(base_s=base_s, max_s=max_s),
        stale_after_s=60,
        **kwargs,
    )


def pause_row(engine, host: str):
    with engine.connect() as c:
        return c.execute(
            sa.text("""SELECT extract(epoch FROM paused_until - paused_at) AS length_s,
                              paused_until, strikes, pauses, kind, reason, run_id
                         FROM dataminer.host_pauses WHERE host = :h"""),
            {"h": host},
        ).one()


def end_pause(engine, host: str) -> None:
    """The pause is over (as if its time had passed)."""
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.host_pauses SET paused_until = now() - interval '1 second',
                              paused_at = now() - interval '1 minute' WHERE host = :h"""),
            {"h": host},
        )


def test_retry_after_is_honoured_as_given_and_a_pause_is_never_shortened(engine):
    t = throttle(engine)
    with t.request_turn("example.com") as turn:
        assert turn.in_force is None
        pause = turn.pause(ThrottleSignal("rate limited", "HTTP 429", retry_after=30))
    assert pause.retry_after == 30 and 29 < pause.remaining_s <= 30
    row = pause_row(engine, "example.com")
    assert float(row.length_s) == 30
    assert (row.strikes, row.pauses, row.run_id) == (1, 1, "run-1")
    assert row.reason == "rate limited (HTTP 429, Retry-After 30s)"

    other = throttle(engine, "run-2")
    other.record_pause("example.com", ThrottleSignal("overloaded", "HTTP 503", retry_after=5))
    shorter = pause_row(engine, "example.com")
    assert shorter.paused_until == row.paused_until, "a shorter pause does not shorten it"
    assert (shorter.strikes, shorter.pauses, shorter.reason) == (1, 1, row.reason)

    other.record_pause("example.com", ThrottleSignal("overloaded", "HTTP 503", retry_after=300))
    longer = pause_row(engine, "example.com")
    assert longer.paused_until > row.paused_until
    assert (longer.kind, longer.run_id, longer.strikes) == ("overloaded", "run-2", 1)


def test_without_retry_after_pauses_double_with_jitter_up_to_the_cap_and_a_success_resets(
    engine,
):
    t = throttle(engine, base_s=10, max_s=35)
    bounds = [(5, 10), (10, 20), (17.5, 35), (17.5, 35)]  # base * 2**strikes, capped, x 0.5-1
    for low, high in bounds:
        t.record_pause("example.com", BOT_CHECK)
        row = pause_row(engine, "example.com")
        assert low <= float(row.length_s) <= high
        end_pause(engine, "example.com")
    assert pause_row(engine, "example.com").strikes == 4

    with t.request_turn("example.com") as turn:
        turn.succeeded()
    assert pause_row(engine, "example.com").strikes == 0
    t.record_pause("example.com", BOT_CHECK)
    assert 5 <= float(pause_row(engine, "example.com").length_s) <= 10
    assert pause_row(engine, "example.com").pauses == 5


def test_a_turn_waits_out_a_short_pause_and_refuses_a_long_one(engine):
    checks = []
    lines = []
    t = throttle(engine, max_wait_s=5, check=lambda: checks.append(1), log=lines.append)
    t.record_pause("example.com", ThrottleSignal("rate limited", "HTTP 429", retry_after=0.3))
    with t.request_turn("example.com") as turn:
        assert turn.in_force is None, "the turn began once the pause was over"
    assert checks, "the caller's lease was checked while waiting"
    assert t.waited_s > 0
    assert any(line.startswith("waiting") and "example.com" in line for line in lines)

    t.record_pause("example.com", ThrottleSignal("rate limited", "HTTP 429", retry_after=60))
    with pytest.raises(HostPaused) as raised, t.request_turn("example.com"):
        pytest.fail("no request may be sent during a long pause")
    assert raised.value.met is False
    assert "host example.com is paused until" in str(raised.value)
    with pytest.raises(HostPaused):
        t.before_starting("example.com")
    t.before_starting("other.example.com")  # other hosts keep going


def _waiting_advisory_locks(engine) -> int:
    with engine.connect() as c:
        return c.execute(
            sa.text("""SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                          AND database = (SELECT oid FROM pg_database
                                           WHERE datname = current_database())""")
        ).scalar_one()


def _wait_until(predicate, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def test_a_pause_starts_when_the_answer_came_not_when_the_turn_began(engine):
    """A turn may wait long for the lock and for the answer (many downloads of one host at once):
    the pause it records is measured from the answer, or the next request leaves early."""
    t = throttle(engine)
    with t.request_turn("example.com") as turn:
        time.sleep(0.1)  # the request is on its way; the turn's transaction began before it
        with engine.connect() as c:
            answered = c.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        turn.pause(ThrottleSignal("rate limited", "HTTP 429", retry_after=30))
    with engine.connect() as c:
        row = c.execute(
            sa.text("""SELECT paused_at, extract(epoch FROM paused_until - paused_at) AS length_s
                         FROM dataminer.host_pauses WHERE host = 'example.com'""")
        ).one()
    assert row.paused_at >= answered, "the pause starts at the answer"
    assert row.length_s == 30


def test_a_request_turn_is_exclusive_and_a_stop_reaches_the_next_request_first(engine):
    """Run B asks for a turn while run A waits for its answer; A's answer is "stop": B's request
    starts only after the pause A recorded, never during it."""
    a, b = throttle(engine, "run-a", max_wait_s=5), throttle(engine, "run-b", max_wait_s=5)
    order: list[str] = []
    b_saw: list = []

    def run_b():
        with b.request_turn("example.com") as turn:
            order.append("b sends")
            b_saw.append(turn.in_force)

    with a.request_turn("example.com") as turn:
        order.append("a sends")
        other = threading.Thread(target=run_b)
        other.start()
        _wait_until(lambda: _waiting_advisory_locks(engine) == 1)
        order.append("a is refused")
        turn.pause(ThrottleSignal("rate limited", "HTTP 429", retry_after=0.5))
    other.join(timeout=30)
    assert order == ["a sends", "a is refused", "b sends"]
    assert b_saw == [None] and b.waited_s > 0, "B waited for the pause A met"


def test_download_slots_are_limited_per_host_across_runs_and_a_stale_run_loses_its_own(engine):
    store = LeaseStore(engine)
    for run in ("run-1", "run-2"):
        store.liveness.heartbeat(run, "test", 1)
    first, second = throttle(engine, "run-1"), throttle(engine, "run-2")
    entered = threading.Event()

    def second_download():
        with second.download_slot("example.com", 2):
            entered.set()

    with first.download_slot("example.com", 2), first.download_slot("example.com", 2):
        with second.download_slot("other.example.com", 2):
            pass  # another host has its own slots
        waiting = threading.Thread(target=second_download)
        waiting.start()
        assert not entered.wait(0.5), "a third download from the host waits for a slot"
        with engine.begin() as c:  # run-1 stops heartbeating: its slots are free to take
            c.execute(
                sa.text("""UPDATE dataminer.run_heartbeats
                              SET heartbeat_at = now() - interval '1 hour' WHERE run_id = 'run-1'""")
            )
        waiting.join(timeout=30)
        assert entered.is_set()
    with engine.connect() as c:
        left = c.execute(sa.text("SELECT count(*) FROM dataminer.download_slots")).scalar_one()
    assert left == 0, "every slot is given back"


def test_active_pauses_show_which_host_until_when_and_why(engine):
    t = throttle(engine, "run-7")
    t.record_pause("a.example.com", ThrottleSignal("rate limited", "HTTP 429", retry_after=600))
    t.record_pause("b.example.com", BOT_CHECK)
    t.record_pause("c.example.com", BOT_CHECK)
    end_pause(engine, "c.example.com")
    paused = active_pauses(engine)
    assert [p.host for p in paused] == ["a.example.com", "b.example.com"]
    first = paused[0].to_json()
    assert first["reason"] == "rate limited (HTTP 429, Retry-After 10m00s)"
    assert first["kind"] == "rate limited" and first["run_id"] == "run-7"
    assert 590 < first["remaining_s"] <= 600 and first["until"] > first["since"]
    assert paused[0].describe().startswith("a.example.com: paused until ")
