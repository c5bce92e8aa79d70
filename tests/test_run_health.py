"""Which runs are dead: `judge` on run records and heartbeats, case by case (no database), and
whether the process behind a heartbeat is gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime

import dagster as dg
import psutil
import pytest
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.storage.dagster_run import DagsterRun, RunRecord

from dataminer_dagster.core.process_liveness import process_gone, process_space
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.run_liveness import Heartbeat
from dataminer_dagster.engine.run_health import (
    PROCESS_GONE_GRACE_S,
    dead_runs,
    judge,
    run_worker_owner,
)
from dataminer_dagster.settings import LeasePolicy, RunPolicy
from dataminer_dagster.tags import LANE_TAG
from dataminer_dagster.testing import instance_for_test

NOW = 1_800_000_000.0
LEASE = LeasePolicy(heartbeat_s=15, stale_after_s=120)
RUNS = RunPolicy(start_grace_s=180, queued_timeout_s=3600)
S = dg.DagsterRunStatus
# How long each run made by `record` has been in its status, as the reaper measures it.
IN_STATUS_S: dict[str, float] = {}


def record(status: S, *, since_s: float, ours: bool = True) -> RunRecord:
    """A run in `status` for `since_s` seconds (requested by our sensors unless not `ours`)."""
    job = "filter_job" if ours else "someone_elses_job"
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("dataminer"), "__repository__")
    run = DagsterRun(
        job_name=job,
        run_id=str(uuid.uuid4()),
        status=status,
        tags={LANE_TAG: "filter"} if ours else {},
        remote_job_origin=RemoteJobOrigin(repository, job),
    )
    IN_STATUS_S[run.run_id] = since_s
    moment = datetime.fromtimestamp(NOW - since_s, tz=UTC)
    started = NOW - since_s if status == S.STARTED else None
    return RunRecord(
        storage_id=1,
        dagster_run=run,
        create_timestamp=moment,
        update_timestamp=moment,
        start_time=started,
    )


def dead(records, heartbeats=None):
    found = judge(records, heartbeats or {}, lease=LEASE, runs=RUNS, in_status_s=IN_STATUS_S)
    return {d.run_id: d for d in found}


@pytest.mark.parametrize("status", [S.STARTED, S.STARTING])
def test_a_run_whose_heartbeat_went_stale_is_dead(status):
    stale, fresh = record(status, since_s=900), record(status, since_s=900)
    found = dead(
        [stale, fresh],
        {
            stale.dagster_run.run_id: Heartbeat(age_s=121, host="gpu-1", pid=4242),
            fresh.dagster_run.run_id: Heartbeat(age_s=119, host="gpu-1", pid=4243),
        },
    )
    assert set(found) == {stale.dagster_run.run_id}
    reason = found[stale.dagster_run.run_id]
    assert not reason.cancel
    assert "no heartbeat for 121 s" in reason.reason and "pid 4242 on gpu-1" in reason.reason


def test_any_run_with_a_stale_heartbeat_is_dead_even_one_a_person_launched():
    theirs = record(S.STARTED, since_s=900, ours=False)
    assert set(dead([theirs], {theirs.dagster_run.run_id: Heartbeat(500, "h", 1)})) == {
        theirs.dagster_run.run_id
    }


@pytest.mark.parametrize("status", [S.STARTED, S.STARTING])
def test_a_started_run_that_never_sent_a_heartbeat_is_dead_after_the_grace(status):
    late, early = record(status, since_s=181), record(status, since_s=179)
    found = dead([late, early])
    assert set(found) == {late.dagster_run.run_id}
    assert "never reported a heartbeat" in found[late.dagster_run.run_id].reason


def test_runs_of_other_jobs_without_a_heartbeat_are_left_alone():
    assert dead([record(S.STARTED, since_s=10_000, ours=False)]) == {}


def test_a_run_created_but_never_submitted_is_cancelled_after_the_grace():
    stuck = record(S.NOT_STARTED, since_s=181)
    [found] = dead([stuck, record(S.NOT_STARTED, since_s=10)]).values()
    assert found.run_id == stuck.dagster_run.run_id and found.cancel


def test_a_run_the_queue_never_started_is_cancelled_after_the_queue_timeout():
    waited = record(S.QUEUED, since_s=3601)
    found = dead([waited, record(S.QUEUED, since_s=3599)])
    assert set(found) == {waited.dagster_run.run_id}
    assert found[waited.dagster_run.run_id].cancel
    assert "queued for 3601 s" in found[waited.dagster_run.run_id].reason


def test_a_canceling_run_is_left_to_dagster():
    assert dead([record(S.CANCELING, since_s=10_000)]) == {}


def test_a_run_worker_waiting_for_its_step_keeps_the_run_alive_but_not_a_dead_step():
    """Under the multiprocess and celery executors the run worker beats apart from its step: a
    run waiting for its `gpu` slot lives; a step whose process died is dead all the same."""
    waiting, step_died, worker_died = (record(S.STARTED, since_s=900) for _ in range(3))
    ids = [r.dagster_run.run_id for r in (waiting, step_died, worker_died)]
    beats = {
        run_worker_owner(ids[0]): Heartbeat(age_s=5, host="gpu-1", pid=10),
        run_worker_owner(ids[1]): Heartbeat(age_s=5, host="gpu-1", pid=11),
        ids[1]: Heartbeat(age_s=600, host="gpu-2", pid=12),
        run_worker_owner(ids[2]): Heartbeat(age_s=600, host="gpu-1", pid=13),
    }
    found = dead([waiting, step_died, worker_died], beats)
    assert set(found) == {ids[1], ids[2]}
    assert "no heartbeat for 600 s (run worker pid 12 on gpu-2" in found[ids[1]].reason
    assert "never reported a heartbeat" in found[ids[2]].reason


# --- a process known to be gone -------------------------------------------------------------------


def exited_pid() -> int:
    """The pid of a process of ours that has exited (and been waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_process_is_gone_when_it_exited_and_alive_while_it_runs():
    here = process_space()
    assert here is not None, "Linux says which boot and pid namespace a process runs in"
    assert not process_gone(os.getpid(), here, beat_age_s=0.5)
    assert process_gone(exited_pid(), here, beat_age_s=0.5)
    # The pid of a process created after the last beat is a reused pid, not the sender's.
    assert process_gone(
        os.getpid(), here, beat_age_s=time.time() - psutil.Process().create_time() + 5
    )
    # From another process space (another container, machine or boot) nothing is known.
    assert not process_gone(exited_pid(), "another-boot pid:[1]", beat_age_s=0.5)
    assert not process_gone(exited_pid(), None, beat_age_s=0.5)


def test_a_run_whose_process_is_gone_is_dead_soon_without_waiting_for_staleness():
    killed, alive, elsewhere = (record(S.STARTED, since_s=60) for _ in range(3))
    here = process_space()
    beat_age_s = PROCESS_GONE_GRACE_S + 1
    beats = {
        killed.dagster_run.run_id: Heartbeat(
            age_s=beat_age_s, host="gpu-1", pid=exited_pid(), process_space=here
        ),
        # pid 1 lives and is older than the beat (a process younger than its beat is a reused pid)
        alive.dagster_run.run_id: Heartbeat(
            age_s=beat_age_s, host="gpu-1", pid=1, process_space=here
        ),
        elsewhere.dagster_run.run_id: Heartbeat(
            beat_age_s, "gpu-2", exited_pid(), "another-boot pid:[1]"
        ),
    }
    found = judge(
        [killed, alive, elsewhere], beats, lease=LEASE, runs=RUNS, in_status_s=IN_STATUS_S
    )
    assert [d.run_id for d in found] == [killed.dagster_run.run_id]
    assert found[0].reason.startswith("its process is gone (pid") and not found[0].cancel


def test_a_run_whose_process_just_went_is_left_to_the_code_server_that_watches_it():
    """Dagster's code server fails a run whose process exited within half a second; failing it
    at the same moment would give the run a second failure event."""
    just_killed = record(S.STARTED, since_s=60)
    beat = Heartbeat(PROCESS_GONE_GRACE_S - 1, "gpu-1", exited_pid(), process_space())
    assert beat.process_gone()
    assert dead([just_killed], {just_killed.dagster_run.run_id: beat}) == {}


def test_a_step_process_gone_between_two_steps_is_not_a_dead_run_while_its_run_worker_beats():
    """Under the multiprocess executor a step's process ends before the next step's begins; the
    run worker's own heartbeat says the run goes on."""
    between_steps, all_gone = record(S.STARTED, since_s=60), record(S.STARTED, since_s=60)
    here = process_space()
    gone_for = PROCESS_GONE_GRACE_S + 1
    beats = {
        between_steps.dagster_run.run_id: Heartbeat(gone_for, "gpu-1", exited_pid(), here),
        run_worker_owner(between_steps.dagster_run.run_id): Heartbeat(
            1, "gpu-1", os.getpid(), here
        ),
        all_gone.dagster_run.run_id: Heartbeat(gone_for, "gpu-1", exited_pid(), here),
        run_worker_owner(all_gone.dagster_run.run_id): Heartbeat(
            gone_for, "gpu-1", exited_pid(), here
        ),
    }
    found = judge([between_steps, all_gone], beats, lease=LEASE, runs=RUNS, in_status_s=IN_STATUS_S)
    assert [d.run_id for d in found] == [all_gone.dagster_run.run_id]


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="making a pid namespace needs unshare(1) and root",
)
def test_a_process_whose_proc_is_another_pid_namespaces_looks_no_pid_up():
    """A sandbox that gives a process its own pid namespace but leaves it the host's /proc: the
    pids of its heartbeats would be looked up among the host's processes, so it judges none
    (only silence tells); with a /proc of its own it does."""
    code = (
        "from dataminer_dagster.core.process_liveness import process_space; print(process_space())"
    )

    def space_in(*unshare: str) -> str:
        return subprocess.run(
            ["unshare", *unshare, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    assert space_in("--pid", "--fork") == "None"
    assert space_in("--pid", "--fork", "--mount-proc") != "None"


def test_the_start_grace_is_measured_on_the_database_clock(engine):
    """A run worker whose clock is two minutes behind wrote a start time two minutes early: the
    grace is counted from when the reaper first saw the run started, on the database's clock."""
    store = LeaseStore(engine)
    runs = RunPolicy(start_grace_s=2, queued_timeout_s=3600)
    behind = record(S.STARTED, since_s=0)
    behind = behind._replace(start_time=time.time() - 120)
    assert dead_runs(None, store, lease=LEASE, runs=runs, records=[behind]) == []
    time.sleep(runs.start_grace_s + 0.5)
    [found] = dead_runs(None, store, lease=LEASE, runs=runs, records=[behind])
    assert (
        found.run_id == behind.dagster_run.run_id and "never reported a heartbeat" in found.reason
    )


def test_the_reaper_gives_a_cancelled_runs_begun_items_back_without_counting_an_attempt(engine):
    """The lease reaper and release_cancelled_runs both see a cancelled run's leases; whichever
    gets there first, an item the run had begun goes back uncounted (a person stopped the run)."""
    import sqlalchemy as sa

    from dataminer_dagster.engine.run_health import reap_dead_work

    store = LeaseStore(engine)
    store.enqueue("filter", ["p.cancelled", "p.failed"])
    with instance_for_test() as instance:
        for key, status in (("p.cancelled", S.CANCELED), ("p.failed", S.FAILURE)):
            run = instance.create_run_for_job(
                dg.GraphDefinition(name="g").to_job(), run_id=str(uuid.uuid4())
            )
            if status == S.CANCELED:
                instance.report_run_canceled(run)
            else:
                instance.report_run_failed(run)
            [lease], _ = store.claim_keys("filter", [key], run.run_id)
            store.mark_started(lease)
        reap_dead_work(instance, store, lease=LEASE, runs=RunPolicy())
    with engine.connect() as c:
        rows = dict(
            c.execute(
                sa.text(
                    "SELECT item_key, attempts FROM dataminer.work_items WHERE stage = 'filter'"
                )
            ).all()
        )
    assert rows == {"p.cancelled": 0, "p.failed": 1}
