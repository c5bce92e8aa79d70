"""A run requested ahead of its input waits for it, before its steps start.

The work sensor requests the filter lane while its videos are still downloading or extracting, and
a project's dedup/detect/dataset lane while its last videos are still being filtered (db/
scheduling.py, `coming`), so that the run's process start and its imports overlap that work. Such a
run (tag `dataminer/ahead`) waits here, in its database resource's set-up: before any step, so it
takes no `gpu` pool slot while it waits. It imports its lane's model libraries meanwhile. Once none of its
partitions is still coming it moves projects whose members just finished to their next stage, and
goes ahead as soon as its first stage has work (or once nothing has come for a while, or after
`runs.ahead_wait_s`); its steps then claim what is ready.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable, Sequence

import dagster as dg

from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_flow import advance_projects
from dataminer_dagster.db.scheduling import claimable_keys, coming
from dataminer_dagster.lanes import LANES_BY_NAME, Lane
from dataminer_dagster.tags import AHEAD_TAG, LANE_TAG, RANGE_END, RANGE_START

POLL_S = 0.25
# Work released by a dead run is requested again at the sensor's next tick (every 5 s at most).
SETTLE_S = 10.0


def is_ahead(run: dg.DagsterRun | None) -> bool:
    """Requested ahead, and not a re-execution: a re-executed run (the UI's Re-execute copies the
    tags) is about work that was there when its first run ran."""
    return run is not None and run.tags.get(AHEAD_TAG) == "true" and run.parent_run_id is None


def run_keys(instance: dg.DagsterInstance, run: dg.DagsterRun, lane: Lane) -> list[str]:
    """The partitions of the run's range, in Dagster's order."""
    order = instance.get_dynamic_partitions(lane.partitions)
    start, end = run.tags.get(RANGE_START), run.tags.get(RANGE_END)
    if start not in order or end not in order:
        return []
    return order[order.index(start) : order.index(end) + 1]


def wait_for_input(
    store: LeaseStore,
    instance: dg.DagsterInstance,
    run: dg.DagsterRun,
    *,
    max_wait_s: float,
    log: Callable[[str], None],
    settle_s: float = SETTLE_S,
) -> float:
    """Wait until the run's partitions are no longer coming and its first stage has work, or
    until nothing has been coming for `settle_s` (it will then find little or nothing to do), or
    `max_wait_s`. Returns the seconds waited."""
    lane = LANES_BY_NAME[run.tags[LANE_TAG]]
    keys = run_keys(instance, run, lane)
    warming = _warm_up(lane.warm_up)
    started = time.monotonic()
    quiet_since: float | None = None
    announced = False
    while keys:
        now = time.monotonic()
        if waiting := coming(store.engine, lane.stages[0], keys=keys):
            quiet_since = None
            if not announced:
                log(
                    f"requested ahead: waiting for {len(waiting)} of {len(keys)} partitions that "
                    f"runs in flight are still producing (at most {max_wait_s:.0f} s)"
                )
                announced = True
        else:
            # A project whose last member just finished moves on now, not at the next tick.
            advance_projects(store)
            if claimable_keys(store.engine, lane.stages[0], keys):
                break
            # Released work waits for its next request (a sensor tick) or a retry: not at once.
            quiet_since = now if quiet_since is None else quiet_since
            if now - quiet_since >= settle_s:
                log(f"nothing has been coming for {settle_s:g} s; going ahead")
                break
        if now - started >= max_wait_s:
            log(
                f"gave up waiting at the limit of {max_wait_s:g} s; "
                f"{len(waiting)} partitions are still coming"
            )
            break
        time.sleep(POLL_S)
    waited = time.monotonic() - started
    if announced and waited < max_wait_s:
        log(f"input ready after {waited:.1f} s")
    # The steps import the same libraries: importing them in two threads at once can hand one a
    # partly initialised module (ImportError: "partially initialized module 'torchvision...'").
    warming.join()
    return waited


def _warm_up(modules: Sequence[str]) -> threading.Thread:
    """Import the lane's heavy libraries in the background while the run waits."""

    def load():
        for name in modules:
            # An optional library: the stage reports it if it needs it.
            with contextlib.suppress(ImportError):
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="warm-up", daemon=True)
    thread.start()
    return thread
