"""What the sensors decide, as plain functions of the claim tables and the Dagster instance, so that
`dataminer run` can drive a project with exactly the same decisions in one foreground process.

One monitor cycle (`plan_cycle`) is what the `work` sensor does on every tick: new catalog rows
become partitions (and deleted rows' partitions go: engine/discovery.py), projects move between
their stages, and runs are requested for the work that is ready, lane by lane, plus runs requested
*ahead* for work that runs in flight are producing, so that the next lane's process starts while
they finish.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.db.acquisition_rounds import continue_acquisition
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.link_progress import copy_link_progress
from dataminer_dagster.db.partition_rows import projects_of_videos
from dataminer_dagster.db.project_flow import Transition, advance_projects
from dataminer_dagster.db.project_records import project_fingerprints
from dataminer_dagster.db.scheduling import (
    REREQUEST_AFTER_S,
    coming,
    mark_requested,
    requestable,
)
from dataminer_dagster.engine.config_versions import config_observations
from dataminer_dagster.engine.discovery import Discovery, DiscoveryCursor, plan_discovery
from dataminer_dagster.engine.run_health import dead_runs, unfinished_runs
from dataminer_dagster.engine.stored_partitions import PartitionOrder
from dataminer_dagster.lanes import Lane
from dataminer_dagster.registry import (
    PROJECT_VIDEOS,
    PROJECTS,
    split_project_video_key,
)
from dataminer_dagster.settings import LeasePolicy, RunPolicy
from dataminer_dagster.tags import (
    AHEAD_TAG,
    BATCH_TAG,
    ITEMS_TAG,
    LANE_TAG,
    PRIORITY_TAG,
    PROJECT_NAMES_TAG,
    PROJECTS_TAG,
    RANGE_END,
    RANGE_START,
    REQUESTED_BY_TAG,
    STAGES_TAG,
)

# With the live runs known, a requested item that no live run covers was requested by a run that
# never came to be: the tick's result was lost after the request was noted (the daemon killed, a
# gRPC deadline passed). It is asked for again after this, not after REREQUEST_AFTER_S.
REREQUEST_UNCOVERED_S = 60.0


# --- runs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    lane: str
    stages: tuple[str, ...]  # the lane's stages this run executes
    request: dg.RunRequest
    item_ids: list[int]  # the ready items it was requested for (none when ahead)
    keys: list[str]

    @property
    def ahead(self) -> bool:
        return self.request.tags.get(AHEAD_TAG) == "true"


@dataclass(frozen=True)
class RunLimits:
    """How runs in flight are judged: a dead run (see run_health) does not count."""

    lease: LeasePolicy
    runs: RunPolicy


def _covered(record: dg.RunRecord, order: PartitionOrder) -> dict[str, int]:
    """The partitions a run's range covers, with their positions in `order`."""
    tags = record.dagster_run.tags
    return order.between(tags.get(RANGE_START, ""), tags.get(RANGE_END, ""))


def plan_runs(
    instance: dg.DagsterInstance,
    store: LeaseStore,
    lanes: Sequence[Lane],
    *,
    jobs: Mapping[str, str] | None = None,
    stage_keys: Mapping[str, dg.AssetKey] | None = None,
    limits: RunLimits | None = None,
    ahead: bool = True,
    rerequest_after_s: float = REREQUEST_AFTER_S,
    discovery: Discovery | None = None,
    projects: Sequence[int] | None = None,
) -> list[PlannedRun]:
    """Runs to request, lane by lane: batches of ready partitions, each a tight range in Dagster's
    partition order, then (with `ahead`) batches of partitions that work in flight is producing.

    With `limits`, runs in flight count against their lane's share (`max_runs`) unless they are
    dead, and no partition that a live run of the lane covers is requested again. Without them
    (`dataminer run`, which executes every request before it plans again) nothing is in flight.
    `jobs` maps lanes to job names; with `stage_keys` (stage -> asset key) a run that starts
    past its lane's first stage selects only the stages it runs. With `projects` (ids) only work
    that concerns these projects is requested, and the runs claim nothing else (PROJECTS_TAG)."""
    engine = store.engine
    removals = (discovery or Discovery()).removals
    in_flight = _live_runs_by_lane(instance, store, limits) if limits else {}
    planned: list[PlannedRun] = []
    for lane in lanes:
        order = PartitionOrder(instance, lane.partitions, removals.get(lane.partitions, ()))
        live = in_flight.get(lane.name, [])
        slots = lane.policy.max_runs - len(live)
        if slots <= 0:
            continue
        covered = {key: at for record in live for key, at in _covered(record, order).items()}
        busy = sorted(covered, key=covered.get)
        again = min(rerequest_after_s, REREQUEST_UNCOVERED_S) if limits else rerequest_after_s
        ready = _ready_batches(engine, lane, order, busy, slots, again, projects)
        for keys, items in ready:
            first = min(lane.stages.index(i.stage) for i in items)
            item_ids = [i.id for i in items]
            planned.append(
                lane_run(
                    lane,
                    lane.stages[first:],
                    keys,
                    item_ids,
                    jobs,
                    stage_keys,
                    projects,
                    project_names=_project_names(engine, lane, keys),
                )
            )
        slots -= len(ready)
        if not (ahead and lane.ahead and slots > 0):
            continue
        taken = covered.keys() | {k for keys, _ in ready for k in keys}
        keys = coming(
            engine,
            lane.stages[0],
            rerequest_after_s=rerequest_after_s,
            planned_ids=[i for p in planned for i in p.item_ids],
            limit=slots * lane.policy.batch,
        )
        positions = order.positions(k for k in keys if k not in taken)
        known = sorted(positions, key=positions.get)
        for start in range(0, len(known), lane.policy.batch):
            chunk = known[start : start + lane.policy.batch]
            planned.append(
                lane_run(
                    lane,
                    lane.stages,
                    chunk,
                    [],
                    jobs,
                    stage_keys,
                    ahead=True,
                    project_names=_project_names(engine, lane, chunk),
                )
            )
    return planned


def _ready_batches(
    engine: sa.Engine,
    lane: Lane,
    order: PartitionOrder,
    busy: Sequence[str],
    slots: int,
    rerequest_after_s: float,
    projects: Sequence[int] | None,
) -> list[tuple[list[str], list]]:
    """Up to `slots` batches of ready keys (each with its items), in partition order. Keys that
    live runs cover (`busy`) are left out in the query, so that they never fill its limit."""
    items = requestable(
        engine, lane.stages, slots * lane.policy.batch, rerequest_after_s, projects, busy
    )
    positions = order.positions(item.key for item in items)
    by_key: dict[str, list] = {}
    for item in items:
        if item.key in positions:
            by_key.setdefault(item.key, []).append(item)
    keys = sorted(by_key, key=positions.get)
    batch = lane.policy.batch
    return [
        (chunk, [i for k in chunk for i in by_key[k]])
        for chunk in (keys[s : s + batch] for s in range(0, len(keys), batch))
    ][:slots]


def _project_names(engine: sa.Engine, lane: Lane, keys: Sequence[str], shown: int = 3) -> str:
    """The projects a run over `keys` works for, as a person reads them: "a, b, c (+4 more)"."""
    if lane.partitions == PROJECTS:
        names = set(keys)
    elif lane.partitions == PROJECT_VIDEOS:
        names = {split_project_video_key(key)[0] for key in keys}
    else:
        names = projects_of_videos(engine, keys)
    ordered = sorted(names)
    more = f" (+{len(ordered) - shown} more)" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more


def lane_run(
    lane: Lane,
    stages: tuple[str, ...],
    keys: list[str],
    item_ids: list[int],
    jobs: Mapping[str, str] | None,
    stage_keys: Mapping[str, dg.AssetKey] | None,
    projects: Sequence[int] | None = None,
    *,
    ahead: bool = False,
    project_names: str = "",
    requested_by: str = "sensor",
) -> PlannedRun:
    """The run of `lane` for `keys` (its `stages`, the ready `item_ids`): its request, with the
    tags that say which partitions, items and projects it is for and who asked."""
    tags = {
        RANGE_START: keys[0],
        RANGE_END: keys[-1],
        LANE_TAG: lane.name,
        STAGES_TAG: ",".join(stages),
        ITEMS_TAG: str(len(item_ids) if item_ids else len(keys)),
        REQUESTED_BY_TAG: requested_by,
    }
    if item_ids:
        tags[BATCH_TAG] = f"{min(item_ids)}-{max(item_ids)}"
    if project_names:
        tags[PROJECT_NAMES_TAG] = project_names
    if projects is not None:
        tags[PROJECTS_TAG] = ",".join(map(str, projects))
    if ahead:
        # Behind every run that is ready to work, in the queue: it would only wait.
        tags.update({AHEAD_TAG: "true", PRIORITY_TAG: "-1"})
    subset = stage_keys is not None and stages != lane.stages
    request = dg.RunRequest(
        job_name=jobs[lane.name] if jobs else None,
        tags=tags,
        asset_selection=[stage_keys[s] for s in stages] if subset else None,
    )
    return PlannedRun(lane.name, stages, request, item_ids, keys)


def _live_runs_by_lane(
    instance: dg.DagsterInstance, store: LeaseStore, limits: RunLimits
) -> dict[str, list[dg.RunRecord]]:
    records = [r for r in unfinished_runs(instance) if LANE_TAG in r.dagster_run.tags]
    dead = {
        d.run_id
        for d in dead_runs(instance, store, lease=limits.lease, runs=limits.runs, records=records)
    }
    live: dict[str, list[dg.RunRecord]] = {}
    for record in records:
        if record.dagster_run.run_id not in dead:
            live.setdefault(record.dagster_run.tags[LANE_TAG], []).append(record)
    return live


def record_requests(engine: sa.Engine, planned: Sequence[PlannedRun]) -> None:
    mark_requested(engine, [i for p in planned for i in p.item_ids])


def batch_range(tags: Mapping[str, str]) -> tuple[int, int] | None:
    raw = tags.get(BATCH_TAG)
    if not raw:
        return None
    first, last = raw.split("-")
    return int(first), int(last)


# --- the whole cycle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cycle:
    discovery: Discovery
    transitions: list[Transition]
    runs: list[PlannedRun]
    # (project, decision) of projects short of their target (db/acquisition_rounds.py)
    acquisitions: list[tuple[str, str]] = field(default_factory=list)
    # New versions of the projects' config assets (engine/config_versions.py)
    config_versions: list[dg.AssetObservation] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{len(keys)} new {name}" for name, keys in self.discovery.additions.items()]
        parts += [f"{len(keys)} deleted {name}" for name, keys in self.discovery.removals.items()]
        parts += [f"project {t.project}: {t.old} -> {t.new} ({t.reason})" for t in self.transitions]
        parts += [f"project {project}: {decision}" for project, decision in self.acquisitions]
        if self.config_versions:
            projects = sorted({o.partition for o in self.config_versions})
            parts.append(f"config versions of {', '.join(projects)}")
        for run in self.runs:
            what = f"{len(run.item_ids)} items" if run.item_ids else f"{len(run.keys)} coming"
            ahead = " (ahead)" if run.ahead else ""
            parts.append(f"requested {'+'.join(run.stages)}{ahead}: {what}")
        return "; ".join(parts)


def plan_cycle(
    instance: dg.DagsterInstance,
    store: LeaseStore,
    lanes: Sequence[Lane],
    cursor: DiscoveryCursor,
    *,
    config_keys: Mapping[str, dg.AssetKey] = {},
    **plan_options,
) -> Cycle:
    """Discovery, project transitions (and the next acquisition round of a completed project
    short of its target), the copy of the videos' progress onto their links (db/link_progress.py)
    and run requests, in that order, so that a new project gets its catalog run and a project
    that just finished its videos its dedup run in the same tick.
    `config_keys` (stage -> its config asset): the projects' config versions that changed since
    the cursor's are observed, for Dagster's stale partitions."""
    found = plan_discovery(store.engine, cursor, instance=instance)
    found.add(instance)  # before the runs over them are planned: in Dagster's order
    moved = advance_projects(store)
    copy_link_progress(store.engine)  # what `dataminer status NAME` reads of the videos
    acquired = continue_acquisition(store)
    runs = plan_runs(instance, store, lanes, discovery=found, **plan_options)
    versions: list[dg.AssetObservation] = []
    if config_keys:
        fingerprints = project_fingerprints(
            store.engine, found.cursor.project, plan_options.get("projects")
        )
        versions, found.cursor.configs = config_observations(
            config_keys, fingerprints, cursor.configs
        )
    return Cycle(found, moved, runs, acquired, versions)


def acquisition_observation(dataset_key: dg.AssetKey, project: str, decision: str):
    """What the UI shows of an acquisition decision: an observation of the project's dataset."""
    return dg.AssetObservation(
        asset_key=dataset_key, partition=project, metadata={"acquisition": decision}
    )
