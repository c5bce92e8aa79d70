"""What the sensors decide, as plain functions of the claim tables and the Dagster instance, so that
`dataminer run` can drive a project with exactly the same decisions in one foreground process."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import dagster as dg
import sqlalchemy as sa
from dagster._core.storage.dagster_run import NOT_FINISHED_STATUSES

from dataminer_dagster.assets.stage import REQUESTED_BY_TAG, STAGE_TAG
from dataminer_dagster.db.scheduling import mark_requested, requestable
from dataminer_dagster.db.schema import SCHEMA
from dataminer_dagster.stages import (
    BACKUP,
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
)

BATCH_TAG = "dataminer/batch"  # "<first work item id>-<last work item id>" of the run's request
MAX_PARTITION_ADDS_PER_TICK = 25_000
RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


@dataclass(frozen=True)
class StagePolicy:
    batch: int  # partitions per run: start-up and model loading are paid once per batch
    max_runs: int  # runs of this stage queued or running at once


POLICIES: dict[str, StagePolicy] = {
    CATALOG: StagePolicy(batch=1, max_runs=2),
    DOWNLOAD: StagePolicy(batch=25, max_runs=3),
    FRAMES: StagePolicy(batch=50, max_runs=2),
    FILTER: StagePolicy(batch=200, max_runs=1),
    DEDUP: StagePolicy(batch=1, max_runs=1),
    DETECT: StagePolicy(batch=1, max_runs=1),
    DATASET: StagePolicy(batch=1, max_runs=2),
    BACKUP: StagePolicy(batch=50, max_runs=1),
}


# --- discovery --------------------------------------------------------------------------------


@dataclass
class DiscoveryCursor:
    project: int = 0
    video: int = 0
    project_video: int = 0

    @classmethod
    def parse(cls, raw: str | None) -> DiscoveryCursor:
        return cls(**json.loads(raw)) if raw else cls()

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


# The catalog rows behind each partition set: (partitions name, cursor field, key query).
_DISCOVERED = [
    ("projects", "project", f"SELECT id, name AS key FROM {SCHEMA}.projects"),
    ("videos", "video", f"SELECT id, video_id AS key FROM {SCHEMA}.videos"),
    (
        "project_videos",
        "project_video",
        f"""SELECT pv.id, p.name || '.' || pv.video_id AS key FROM {SCHEMA}.project_videos pv
            JOIN {SCHEMA}.projects p ON p.id = pv.project_id""",
    ),
]


def plan_discovery(
    engine: sa.Engine,
    cursor: DiscoveryCursor,
    budget: int = MAX_PARTITION_ADDS_PER_TICK,
    *,
    instance: dg.DagsterInstance | None = None,
) -> Discovery:
    """New catalog rows become partitions: projects, videos, project videos (in that order, in
    discovery order, at most `budget` per call). With the `instance`, once nothing is new, the
    partitions whose row was deleted are to be removed."""
    result = Discovery(cursor=DiscoveryCursor(**cursor.__dict__))
    with engine.connect() as c:
        for partitions_name, field_name, query in _DISCOVERED:
            left = budget - result.count
            if left <= 0:
                break
            rows = c.execute(
                sa.text(f"SELECT * FROM ({query}) q WHERE id > :after ORDER BY id LIMIT :n"),
                {"after": getattr(cursor, field_name), "n": left},
            ).all()
            if rows:
                result.additions[partitions_name] = [r.key for r in rows]
                setattr(result.cursor, field_name, rows[-1].id)
    if instance is not None and not result.count:
        result.removals = _partitions_of_deleted_rows(instance, engine)
    return result


def _partitions_of_deleted_rows(
    instance: dg.DagsterInstance, engine: sa.Engine
) -> dict[str, list[str]]:
    """Partitions whose catalog row is gone (a project or videos deleted with the CLI), by
    partitions name. Dagster's keys are read before the catalog's, so that a row created meanwhile
    can only be missing from the first list, never wrongly pruned."""
    listed = {name: instance.get_dynamic_partitions(name) for name, _, _ in _DISCOVERED}
    gone: dict[str, list[str]] = {}
    with engine.connect() as c:
        for name, _, query in _DISCOVERED:
            if listed[name]:
                current = set(c.execute(sa.text(f"SELECT key FROM ({query}) q")).scalars())
                if keys := [k for k in listed[name] if k not in current]:
                    gone[name] = keys
    return gone


# --- work -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedRun:
    stage: str
    request: dg.RunRequest
    item_ids: list[int]


def runs_in_flight(instance: dg.DagsterInstance, stage: str) -> int:
    return instance.get_runs_count(
        dg.RunsFilter(tags={STAGE_TAG: stage}, statuses=list(NOT_FINISHED_STATUSES))
    )


def plan_work(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    stage_assets: Mapping[str, dg.AssetsDefinition],
    *,
    rerequest_after_s: float = 900.0,
    count_in_flight: bool = True,
    policies: Mapping[str, StagePolicy] = POLICIES,
    jobs: Mapping[str, str] | None = None,
) -> list[PlannedRun]:
    """Runs to request for claimable work: batches of partitions per stage, each a tight range in
    Dagster's partition order, without exceeding the stage's share of concurrent runs."""
    planned: list[PlannedRun] = []
    orders: dict[str, dict[str, int]] = {}
    for stage, asset in stage_assets.items():
        policy = policies[stage]
        slots = policy.max_runs - (runs_in_flight(instance, stage) if count_in_flight else 0)
        if slots <= 0:
            continue
        items = requestable(engine, stage, slots * policy.batch, rerequest_after_s)
        if not items:
            continue
        partitions_name = asset.partitions_def.name
        if partitions_name not in orders:
            orders[partitions_name] = {
                k: i for i, k in enumerate(instance.get_dynamic_partitions(partitions_name))
            }
        order = orders[partitions_name]
        known = sorted((i for i in items if i.key in order), key=lambda i: order[i.key])
        for start in range(0, len(known), policy.batch):
            chunk = known[start : start + policy.batch]
            ids = sorted(i.id for i in chunk)
            tags = {
                RANGE_START: chunk[0].key,
                RANGE_END: chunk[-1].key,
                STAGE_TAG: stage,
                REQUESTED_BY_TAG: "sensor",
                BATCH_TAG: f"{ids[0]}-{ids[-1]}",
            }
            request = (
                dg.RunRequest(job_name=jobs[stage], tags=tags)
                if jobs
                else dg.RunRequest(asset_selection=[asset.key], tags=tags)
            )
            planned.append(PlannedRun(stage, request, [i.id for i in chunk]))
    return planned


def record_requests(engine: sa.Engine, planned: Sequence[PlannedRun]) -> None:
    mark_requested(engine, [i for p in planned for i in p.item_ids])


def batch_range(tags: Mapping[str, str]) -> tuple[int, int] | None:
    raw = tags.get(BATCH_TAG)
    if not raw:
        return None
    first, last = raw.split("-")
    return int(first), int(last)
