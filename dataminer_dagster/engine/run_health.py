"""Which Dagster runs are dead, judged by the claim tables' run heartbeats.

Under the default run launcher (what `dagster dev` uses) Dagster cannot see a killed run worker:
the run stays STARTED for ever, counts against its lane's share of runs and keeps its `gpu` pool
slot. Every run that uses the database resource keeps a heartbeat row alive from a thread; this
module reads those rows beside Dagster's run records and says which runs are dead and why, in words
a person can read in the UI. A run is dead when its heartbeat went stale, or within seconds when
its process is known to be gone (a reaper in the same process space looks the pid up:
core/process_liveness.py), as after a SIGKILL of the daemon with its runs. The lease reaper fails
(or, when they never started, cancels) them: `reap_dead_work` is its pass, shared by the sensor
and `dataminer run`.

An outage is not a death: silence and waits are counted only over time the database was up (from
its start, and from the end of the last outage a reaper met: db/run_liveness.py), and a pass
begins by recording the outage this process met, a write that fails, and stops the pass before it
judges anyone, while the database is away or its disk is full.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
from dagster._core.storage.dagster_run import FINISHED_STATUSES, NOT_FINISHED_STATUSES

from dataminer_dagster.db.file_changes import remove_dead_leftovers
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.outages import outages_of
from dataminer_dagster.db.run_liveness import Heartbeat, Reaped
from dataminer_dagster.settings import LeasePolicy, RunPolicy
from dataminer_dagster.tags import LANE_TAG

Status = dg.DagsterRunStatus

# A run whose process is found gone is failed once its last heartbeat is this old, not at once:
# the code server that launched it watches its run processes every half second and fails a dead
# one itself (Dagster's own path, with the exit code in an engine event). Failing it at the same
# moment would give the run two failure events, one from each side (seen under CI load).
PROCESS_GONE_GRACE_S = 10.0


@dataclass(frozen=True)
class DeadRun:
    run: dg.DagsterRun
    reason: str
    cancel: bool  # it never ran: cancel it; a run that started is failed

    @property
    def run_id(self) -> str:
        return self.run.run_id


def run_worker_owner(run_id: str) -> str:
    """The heartbeat row of a run's run worker, kept apart from its steps' (the run's own id) under
    the executors that run steps in other processes (hosting/run_heartbeat.py): it tells that the
    run waits for a step to start, never that a started step lives."""
    return f"{run_id}/run-worker"


def heartbeats_of(store: LeaseStore, run_ids: Sequence[str]) -> dict[str, Heartbeat]:
    """The heartbeats of these runs and of their run workers."""
    return store.liveness.heartbeats([*run_ids, *(run_worker_owner(r) for r in run_ids)])


def unfinished_runs(instance: dg.DagsterInstance) -> list[dg.RunRecord]:
    return list(instance.get_run_records(dg.RunsFilter(statuses=list(NOT_FINISHED_STATUSES))))


def judge(
    records: Iterable[dg.RunRecord],
    heartbeats: Mapping[str, Heartbeat],
    *,
    lease: LeasePolicy,
    runs: RunPolicy,
    in_status_s: Mapping[str, float],
    gone: Callable[[Heartbeat], bool] = Heartbeat.process_gone,
) -> list[DeadRun]:
    """The runs among `records` (unfinished in Dagster) that are dead. A run with a heartbeat
    row is dead when the row went stale (its silence counted only while the database was up:
    `RunLiveness.heartbeats`), or when its process is `gone` and so is its run
    worker's (between two steps of a multiprocess run the step's process is gone while its run
    worker beats), from `PROCESS_GONE_GRACE_S` after its last heartbeat; one without is alive
    while its run worker beats (it waits for a step to start), else judged only if the sensors
    requested it (a person's run of another job may never use our resource): it must have a
    heartbeat within `start_grace_s` of starting, and the queue must start it within
    `queued_timeout_s`. How long each run has been in its status is `in_status_s` (by run id),
    measured on the database's clock (`RunLiveness.in_status_s`), never with the run record's
    times: the run worker's clock wrote those."""
    dead = []
    for record in records:
        run = record.dagster_run
        beat = heartbeats.get(run.run_id)
        waiting = heartbeats.get(run_worker_owner(run.run_id))
        requested_here = LANE_TAG in run.tags
        if beat is not None and run.status in (Status.STARTING, Status.STARTED):
            if beat.age_s > lease.stale_after_s:
                dead.append(
                    DeadRun(
                        run,
                        f"no heartbeat for {beat.age_s:.0f} s (run worker pid {beat.pid} on "
                        f"{beat.host}; a run is failed after {lease.stale_after_s:.0f} s of "
                        "silence): its process was killed or hangs. Its items go back to the "
                        "queue.",
                        cancel=False,
                    )
                )
            elif (
                beat.age_s >= PROCESS_GONE_GRACE_S
                and gone(beat)
                and (waiting is None or waiting.age_s > lease.stale_after_s or gone(waiting))
            ):
                dead.append(
                    DeadRun(
                        run,
                        f"its process is gone (pid {beat.pid} on {beat.host}, last heartbeat "
                        f"{beat.age_s:.0f} s ago): it was killed or crashed. Its items go back "
                        "to the queue.",
                        cancel=False,
                    )
                )
            continue
        if waiting is not None and waiting.age_s <= lease.stale_after_s:
            continue
        if not requested_here:
            continue
        waited = in_status_s.get(run.run_id, 0.0)
        if run.status in (Status.STARTING, Status.STARTED) and waited > runs.start_grace_s:
            dead.append(
                DeadRun(
                    run,
                    f"{run.status.value.lower()} {waited:.0f} s ago and never reported a heartbeat "
                    f"(allowed: {runs.start_grace_s:.0f} s): its process died before it began its "
                    "work. Its items go back to the queue.",
                    cancel=False,
                )
            )
        elif run.status == Status.NOT_STARTED and waited > runs.start_grace_s:
            dead.append(
                DeadRun(
                    run,
                    f"created {waited:.0f} s ago and never submitted to the run queue (the daemon "
                    "stopped in between). Its items will be requested again.",
                    cancel=True,
                )
            )
        elif run.status == Status.QUEUED and waited > runs.queued_timeout_s:
            dead.append(
                DeadRun(
                    run,
                    f"queued for {waited:.0f} s without starting (allowed: "
                    f"{runs.queued_timeout_s:.0f} s): is the daemon's run queue running, and are "
                    "max_concurrent_runs and the pools free? Its items will be requested again.",
                    cancel=True,
                )
            )
    return dead


def dead_runs(
    instance: dg.DagsterInstance,
    store: LeaseStore,
    *,
    lease: LeasePolicy,
    runs: RunPolicy,
    records: Sequence[dg.RunRecord] | None = None,
) -> list[DeadRun]:
    records = unfinished_runs(instance) if records is None else list(records)
    if not records:
        return []
    heartbeats = heartbeats_of(store, [r.dagster_run.run_id for r in records])
    in_status_s = store.liveness.in_status_s(
        [(r.dagster_run.run_id, r.dagster_run.status.value) for r in records]
    )
    return judge(records, heartbeats, lease=lease, runs=runs, in_status_s=in_status_s)


def end_dead_runs(instance: dg.DagsterInstance, dead: Iterable[DeadRun]) -> list[DeadRun]:
    """Mark the dead runs failed (or cancelled) in Dagster, with the reason, and free their pool
    slots at once: their processes are gone, so nothing else ever would. A run that finished
    since it was judged (its run worker, or the code server that launched it, said so) is left
    as it is. Returns the runs ended."""
    ended = []
    for d in dead:
        current = instance.get_run_by_id(d.run_id)
        if current is None or current.is_finished:
            continue
        ended.append(d)
        if d.cancel:
            instance.report_run_canceled(d.run, message=f"Cancelled by dataminer: {d.reason}")
        else:
            instance.report_run_failed(d.run, message=f"Failed by dataminer: {d.reason}")
        instance.event_log_storage.free_concurrency_slots_for_run(d.run_id)
    return ended


@dataclass(frozen=True)
class ReaperPass:
    """What one pass of the lease reaper did: the dead runs it ended, the leases it took back, and
    the files that workers which died left beside their outputs, removed."""

    dead: list[DeadRun]
    reaped: list[Reaped]
    leftovers: list[Path] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line a person can read for each run ended, each lease taken back and each leftover
        removed."""
        return (
            [
                f"run {d.run_id} ({d.run.tags.get(LANE_TAG) or d.run.job_name}) "
                f"{'cancelled' if d.cancel else 'failed'}: {d.reason}"
                for d in self.dead
            ]
            + [
                f"{r.stage} {r.key}: lease of run {r.owner} taken back; now {r.status}"
                for r in self.reaped
            ]
            + [f"removed {path}, left by a worker whose lease is dead" for path in self.leftovers]
        )


def reap_dead_work(
    instance: dg.DagsterInstance, store: LeaseStore, *, lease: LeasePolicy, runs: RunPolicy
) -> ReaperPass:
    """The lease reaper's pass, for the sensor and for `dataminer run`: end the dead runs in
    Dagster, then take back the leases of runs that stopped heartbeating or that Dagster reports
    as finished. A cancelled run's leases go back uncounted, as the release_cancelled_runs
    sensor gives them back: a person stopped the run, its items did nothing wrong, whichever of
    the two gets there first. Then what workers that died left beside the outputs they were
    staging is removed once their leases are dead (db/file_changes.py `remove_dead_leftovers`):
    a dead item has no later holder to do it. Raises the database's error, judging no one, while
    it is away."""
    reaper = f"{socket.gethostname()} {os.getpid()}"
    outages_of(store.engine.url).record(
        lambda outage_s: store.liveness.record_reaper_pass(reaper, outage_s)
    )
    dead = end_dead_runs(instance, dead_runs(instance, store, lease=lease, runs=runs))
    owners = store.liveness.lease_owners()
    records = (
        instance.get_run_records(dg.RunsFilter(run_ids=owners, statuses=list(FINISHED_STATUSES)))
        if owners
        else []
    )
    finished = []
    for record in records:
        run_id = record.dagster_run.run_id
        if record.dagster_run.status == Status.CANCELED:
            store.liveness.release_run(run_id, f"run {run_id} was cancelled", count_attempt=False)
        else:
            finished.append(run_id)
    reaped = store.liveness.reap(lease.stale_after_s, finished)
    return ReaperPass(dead, reaped, remove_dead_leftovers(store.engine))
