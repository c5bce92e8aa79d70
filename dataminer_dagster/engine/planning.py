"""What the sensors decide, as plain functions of the claim tables and the Dagster instance, so that
`dataminer run` can drive a project with exactly the same decisions in one foreground process.

One monitor cycle (`plan_cycle`) is what the `work` sensor does on every tick: new catalog rows
become partitions (and deleted rows' partitions go), projects move between their stages, and runs
are requested for the work that is ready, lane by lane, plus runs requested *ahead* for work that
runs in flight are producing, so that the next lane's process starts while they finish.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.db.acquisition_rounds import continue_acquisition
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.partition_rows import (
    PARTITION_SETS,
    all_keys,
    projects_of_videos,
    row_count,
    rows_after,
)
from dataminer_dagster.db.project_flow import Transition, advance_projects
from dataminer_dagster.db.project_records import project_fingerprints
from dataminer_dagster.db.scheduling import (
    REREQUEST_AFTER_S,
    coming,
    mark_requested,
    requestable,
)
from dataminer_dagster.engine.config_versions import config_observations
from dataminer_dagster.engine.lanes import Lane
from dataminer_dagster.engine.registry import (
    PROJECT_VIDEOS,
    PROJECTS,
    VIDEOS,
    split_project_video_key,
)
from dataminer_dagster.engine.run_health import dead_runs, unfinished_runs
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

MAX_PARTITION_ADDS_PER_TICK = 25_000
# The catalog is compared with Dagster on a tick that finds nothing new, at most this often: the
# number of rows of each set (kept by triggers, db/partition_rows.py) against the number of
# partitions Dagster holds (the planner's kept order). Only where they differ are the keys
# themselves compared, which reads them all (18 s at 1,000,000 videos: bench/README.md, "Scale");
# that full pass is also made FULL_COMPARE_EVERY_S apart whatever the counts say, for the rare
# pair of changes that leaves them equal (a row the cursor passed and a partition whose row was
# deleted, both within COMPARE_EVERY_S).
COMPARE_EVERY_S = 30.0
FULL_COMPARE_EVERY_S = 3600.0
# With the live runs known, a requested item that no live run covers was requested by a run that
# never came to be: the tick's result was lost after the request was noted (the daemon killed, a
# gRPC deadline passed). It is asked for again after this, not after REREQUEST_AFTER_S.
REREQUEST_UNCOVERED_S = 60.0


# --- discovery --------------------------------------------------------------------------------


@dataclass
class DiscoveryCursor:
    project: int = 0
    video: int = 0
    project_video: int = 0
    compared_at: float = 0.0  # when the catalog was last compared with Dagster (epoch)
    full_compared_at: float = 0.0  # ... key by key
    # {project: digest of the config versions last reported} (engine/config_versions.py)
    configs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: str | None) -> DiscoveryCursor:
        """A cursor as `dump` wrote it; fields another version wrote or left out are ignored or
        take their defaults (the sensor's cursor outlives an upgrade and a downgrade)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(raw).items() if k in known}) if raw else cls()

    def dump(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class Discovery:
    additions: dict[str, list[str]] = field(default_factory=dict)  # partitions def name -> new keys
    removals: dict[str, list[str]] = field(default_factory=dict)  # ... -> keys whose row is gone
    cursor: DiscoveryCursor = field(default_factory=DiscoveryCursor)

    @property
    def count(self) -> int:
        return sum(len(keys) for keys in self.additions.values())

    def add(self, instance: dg.DagsterInstance) -> None:
        """Add the new partitions, in bulk: one `add_dynamic_partitions` per partition set (at
        most MAX_PARTITION_ADDS_PER_TICK keys a cycle). The work sensor does this itself rather
        than return AddDynamicPartitionsRequests, which the sensor daemon applies key by key
        (a `has_dynamic_partition` query per key) and logs whole: far slower (bench/README.md,
        discovery). Adding is idempotent (existing keys are skipped), so a tick that
        fails after it only adds them again; the cursor moves with the tick's result."""
        for name, keys in self.additions.items():
            instance.add_dynamic_partitions(name, keys)

    def removal_requests(
        self, partitions: Mapping[str, dg.DynamicPartitionsDefinition]
    ) -> list[dg.DeleteDynamicPartitionsRequest]:
        """The partitions of deleted rows, for the sensor daemon to remove (rare: deletions)."""
        return [partitions[name].build_delete_request(keys) for name, keys in self.removals.items()]

    def apply(self, instance: dg.DagsterInstance) -> None:
        """Additions and removals at once, for callers that drive runs themselves."""
        self.add(instance)
        for name, keys in self.removals.items():
            for key in keys:
                instance.delete_dynamic_partition(name, key)


# The cursor field of each partition set's rows.
_CURSOR_FIELDS = {PROJECTS: "project", VIDEOS: "video", PROJECT_VIDEOS: "project_video"}


def plan_discovery(
    engine: sa.Engine,
    cursor: DiscoveryCursor,
    budget: int = MAX_PARTITION_ADDS_PER_TICK,
    *,
    instance: dg.DagsterInstance | None = None,
) -> Discovery:
    """New catalog rows become partitions: projects, videos, project videos (in that order, in
    discovery order, at most `budget` per call).

    The cursor (the last id seen) finds new rows cheaply, but ids are taken when rows are
    inserted, not when their transactions commit: a row committed after a row with a higher id
    (two catalog runs, `add-video` during one) is passed by it. So, with the `instance`, once the
    cursor finds nothing new (and at most every `COMPARE_EVERY_S`), the catalog's keys are
    compared with Dagster's: rows the cursor passed are added, and partitions whose row was
    deleted are to be removed."""
    result = Discovery(cursor=replace(cursor))
    with engine.connect() as c:
        for partitions_name in PARTITION_SETS:
            field_name = _CURSOR_FIELDS[partitions_name]
            left = budget - result.count
            if left <= 0:
                break
            rows = rows_after(c, partitions_name, getattr(cursor, field_name), left)
            if rows:
                result.additions[partitions_name] = [r.key for r in rows]
                setattr(result.cursor, field_name, rows[-1].id)
    now = time.time()
    if instance is not None and not result.count and now - cursor.compared_at >= COMPARE_EVERY_S:
        full_due = now - cursor.full_compared_at >= FULL_COMPARE_EVERY_S
        if full_due or not _counts_agree(instance, engine):
            listed, result.additions, result.removals = _compare_with_dagster(
                instance, engine, budget
            )
            result.cursor.full_compared_at = now
            for name in PARTITION_SETS:  # the kept order: Dagster's keys and this cycle's
                known = _known_order(instance, name, result)
                with _KNOWN_ORDERS_LOCK:  # keys deleted by other hands (the UI) are forgotten
                    known.keep_only({*listed[name], *result.additions.get(name, ())})
        result.cursor.compared_at = now
    return result


def _counts_agree(instance: dg.DagsterInstance, engine: sa.Engine) -> bool:
    """Each set has as many rows in the catalog as partitions in Dagster (the kept order, read
    from where it was left: it costs what changed)."""
    with engine.connect() as c:
        return all(
            row_count(c, name) == len(_known_order(instance, name, Discovery()).positions)
            for name in PARTITION_SETS
        )


def _compare_with_dagster(
    instance: dg.DagsterInstance, engine: sa.Engine, budget: int
) -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """(Dagster's keys; rows without a partition, at most `budget` in id order; partitions
    whose row is gone), by partitions name. Dagster's keys are read before the catalog's, so
    that a row created meanwhile can only be missing from the first list (and is added: adding
    is idempotent), never wrongly pruned."""
    listed = {name: instance.get_dynamic_partitions(name) for name in PARTITION_SETS}
    missed: dict[str, list[str]] = {}
    gone: dict[str, list[str]] = {}
    with engine.connect() as c:
        for name in PARTITION_SETS:
            current = all_keys(c, name)
            known, present = set(listed[name]), set(current)
            left = budget - sum(len(keys) for keys in missed.values())
            if left > 0 and (keys := [k for k in current if k not in known][:left]):
                missed[name] = keys
            if keys := [k for k in listed[name] if k not in present]:
                gone[name] = keys
    return listed, missed, gone


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


# Dagster's order of each partition set is kept between ticks in the process that plans (the code
# server under the daemon, `dataminer run`'s own): a tick reads only the keys added since the last
# one (Dagster's storage-id cursor), so a quiet tick costs what changed, not the catalog's size. It
# is read whole again at most this often; keys deleted by other hands are forgotten sooner, by
# the comparison with the catalog that their missing count sets off (plan_discovery).
ORDER_REREAD_EVERY_S = 3600.0
_ORDER_PAGE = 50_000


@dataclass
class _KnownOrder:
    """Dagster's order of one partition set as last read: its keys (positions in that list; a key
    forgotten keeps its place, unused) and where the next read starts."""

    keys: list[str] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    cursor: str | None = None
    read_at: float = field(default_factory=time.monotonic)

    def append(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key not in self.positions:
                self.positions[key] = len(self.keys)
                self.keys.append(key)

    def read_new(self, instance: dg.DagsterInstance, name: str) -> None:
        while True:
            page = instance.get_paginated_dynamic_partitions(
                name, limit=_ORDER_PAGE, ascending=True, cursor=self.cursor
            )
            self.append(page.results)
            self.cursor = page.cursor
            if not page.has_more:
                return

    def forget(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.positions.pop(key, None)

    def keep_only(self, present: set[str]) -> None:
        self.forget([key for key in self.positions if key not in present])


_KNOWN_ORDERS: dict[tuple[str, str], _KnownOrder] = {}
_KNOWN_ORDERS_LOCK = threading.Lock()


def _known_order(instance: dg.DagsterInstance, name: str, discovery: Discovery) -> _KnownOrder:
    """The order of partition set `name` on `instance`, brought up to date: the keys Dagster added
    since the last read, then this cycle's discovery (its keys added last, its removals gone)."""
    from dagster._serdes import serialize_value

    try:
        identity = serialize_value(instance.get_ref())  # a new instance object each tick
    except dg.DagsterInvariantViolationError:  # an ephemeral instance: nothing to keep
        identity = None
    with _KNOWN_ORDERS_LOCK:
        known = _KNOWN_ORDERS.get((identity, name)) if identity else None
        if known is None or time.monotonic() - known.read_at > ORDER_REREAD_EVERY_S:
            known = _KnownOrder()
            if identity:
                _KNOWN_ORDERS[identity, name] = known
        known.read_new(instance, name)
        known.forget(discovery.removals.get(name, ()))
        known.append(discovery.additions.get(name, ()))
    return known


@dataclass
class _PartitionOrders:
    """Dagster's order of each partition set, as it will be once this cycle's discovery is
    applied: the keys being added last, those being removed gone."""

    instance: dg.DagsterInstance
    discovery: Discovery
    _orders: dict[str, _KnownOrder] = field(default_factory=dict)

    def known(self, name: str) -> _KnownOrder:
        if name not in self._orders:
            self._orders[name] = _known_order(self.instance, name, self.discovery)
        return self._orders[name]

    def __getitem__(self, name: str) -> Mapping[str, int]:
        return self.known(name).positions


def _covered(record: dg.RunRecord, order: Mapping[str, int]) -> range:
    """Positions (in `order`) of the partitions a run's range covers."""
    tags = record.dagster_run.tags
    start, end = order.get(tags.get(RANGE_START, "")), order.get(tags.get(RANGE_END, ""))
    return range(0) if start is None or end is None else range(start, end + 1)


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
    orders = _PartitionOrders(instance, discovery or Discovery())
    in_flight = _live_runs_by_lane(instance, store, limits) if limits else {}
    planned: list[PlannedRun] = []
    for lane in lanes:
        order = orders[lane.partitions]
        live = in_flight.get(lane.name, [])
        slots = lane.policy.max_runs - len(live)
        if slots <= 0:
            continue
        covered = {position for record in live for position in _covered(record, order)}
        busy = [orders.known(lane.partitions).keys[position] for position in sorted(covered)]
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
        taken = covered | {order[k] for keys, _ in ready for k in keys}
        keys = coming(
            engine,
            lane.stages[0],
            rerequest_after_s=rerequest_after_s,
            planned_ids=[i for p in planned for i in p.item_ids],
            limit=slots * lane.policy.batch,
        )
        known = sorted((k for k in keys if k in order and order[k] not in taken), key=order.get)
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
    order: Mapping[str, int],
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
    by_key: dict[str, list] = {}
    for item in items:
        if item.key in order:
            by_key.setdefault(item.key, []).append(item)
    keys = sorted(by_key, key=order.get)
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
    short of its target) and run requests, in that order, so that a new project gets its
    catalog run and a project that just finished its videos its dedup run in the same tick.
    `config_keys` (stage -> its config asset): the projects' config versions that changed since
    the cursor's are observed, for Dagster's stale partitions."""
    found = plan_discovery(store.engine, cursor, instance=instance)
    moved = advance_projects(store)
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
