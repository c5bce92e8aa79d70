"""The pipeline's Definitions: assets, lane jobs, sensors, resources and the executor, built by
`build_definitions` for any code location; `defs` is this repository's own.

Cross-cutting policy lives here only.

* Executor: in-process by default. A lane's run executes its stages one after another in the run
  worker, so a run costs one process start, and resources (the run's heartbeat, its claims) are
  set up once, before any step. `multiprocess` gives each step its own process (with at most one
  GPU step at a time within a run); `celery` sends steps to dagster-celery workers through their
  queues (docs/deployment.md). Under both the run worker keeps the run's heartbeat
  (hosting/run_heartbeat.py): its steps' resources start only once a step runs.
* GPU use is bounded by the `gpu` pool (dagster.yaml): filter, dedup and detect take a slot of it
  for the length of their step, across all runs. The op tag `dataminer/device: gpu` only routes
  (the `gpu` celery queue) and, under the multiprocess executor, limits steps within one run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import dagster as dg

from dataminer_dagster.assets.catalog.config import RefreshConfig
from dataminer_dagster.engine.assembly import pipeline_assets, stage_assets, with_key_prefix
from dataminer_dagster.engine.jobs import lane_jobs
from dataminer_dagster.engine.stage_asset import StageAsset
from dataminer_dagster.hosting.run_heartbeat import with_run_heartbeat
from dataminer_dagster.lanes import configured_lanes
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import YtDlpClient
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.sensors.pipeline_sensors import build_sensors
from dataminer_dagster.sensors.refresh_schedules import (
    followed_projects,
    refresh_schedules,
    scheduled_projects,
)
from dataminer_dagster.settings import EXECUTORS, Settings, executor_name, load_settings
from dataminer_dagster.tags import DEVICE_TAG, GPU_OP_TAGS

GPU_LIMIT = [{"key": DEVICE_TAG, "value": GPU_OP_TAGS[DEVICE_TAG], "limit": 1}]
_NAME = re.compile(r"^[A-Za-z0-9_]+$")


def pipeline_executor(choice: str | None = None) -> dg.ExecutorDefinition:
    """The executor named `choice` (default: $DATAMINER_EXECUTOR, else in_process): in_process,
    multiprocess, or celery for a broker (DATAMINER_CELERY_BROKER, default dagster-celery's
    pyamqp://guest@localhost//) and workers per queue."""
    choice = choice or executor_name()
    if choice == "celery":
        from dagster_celery import celery_executor

        broker = os.environ.get("DATAMINER_CELERY_BROKER")
        return with_run_heartbeat(
            celery_executor.configured({"broker": broker}) if broker else celery_executor
        )
    if choice == "multiprocess":
        return with_run_heartbeat(
            dg.multiprocess_executor.configured({"tag_concurrency_limits": GPU_LIMIT})
        )
    if choice == "in_process":
        return dg.in_process_executor
    raise ValueError(f"executor {choice!r}: expected one of {', '.join(EXECUTORS)}")


def pipeline_stages(
    prefix: str | Sequence[str] | None = None, group: str | None = None
) -> dict[str, StageAsset]:
    """The registry's stages, their asset keys under `prefix` and all in `group` when given."""
    stages = stage_assets()
    parts = (prefix,) if isinstance(prefix, str) else tuple(prefix or ())
    wrong = [p for p in parts if not _NAME.match(p)]
    if wrong:
        raise ValueError(
            f"prefix {wrong[0]!r}: a prefix is made of letters, digits and underscores "
            "(it starts the names of the pipeline's assets, jobs and sensors)"
        )
    if group is not None and not _NAME.match(group):
        raise ValueError(
            f"group {group!r}: a group name is made of letters, digits and underscores"
        )
    return with_key_prefix(stages, parts, group) if parts or group else stages


def build_definitions(
    *,
    prefix: str | Sequence[str] | None = None,
    group: str | None = None,
    settings: Settings | str | os.PathLike | None = None,
    executor: dg.ExecutorDefinition | str | None = None,
    followed: Mapping[str, RefreshConfig] | None = None,
) -> dg.Definitions:
    """The pipeline as Definitions to merge into a code location (`dg.Definitions.merge`).

    `prefix`: put the asset keys under it (`dm/dataset`) and start the names of the ops, jobs
    and sensors with it (`dm_project_job`, `dm_work`), so that they cannot collide with the
    location's own. `group`: every asset in this group (default: `ingest` and `curation`).
    `settings`: a settings file (or `Settings`) for the lanes' batches and run shares, the
    sensors' intervals, retries and leases (default: $DATAMINER_SETTINGS, read now). `executor`:
    the lane jobs' executor and the location's default, an executor definition or one of
    in_process, multiprocess, celery (default: $DATAMINER_EXECUTOR, else in_process).
    `followed`: the projects that get a `refresh_project_<name>` schedule, by name, with their
    `inputs.refresh` (default: read from the database when a Dagster loader initialises the
    location, sensors/refresh_schedules.py).

    The resources are `db`, `download_client` and `models`; the lane assets carry the stages' IO manager
    (`dataminer_outputs`, outputs.py), which reads the claim database through `db`. The dynamic
    partition sets (`videos`, `projects`, `project_videos`) belong to the Dagster instance, so
    one instance runs one copy of the pipeline's sensors."""
    if isinstance(settings, Settings):
        chosen = settings
        db = DatabaseResource(
            database_url=settings.database_url,
            data_dir=str(settings.data_dir),
            settings_file=str(settings.source) if settings.source else None,
        )
    elif settings is not None:
        chosen = load_settings(settings)
        db = DatabaseResource(settings_file=str(settings))
    else:
        chosen, db = load_settings(), DatabaseResource()
    executor_def = (
        executor if isinstance(executor, dg.ExecutorDefinition) else pipeline_executor(executor)
    )
    stages = pipeline_stages(prefix, group)
    lanes = configured_lanes(chosen)
    jobs = lane_jobs(stages, lanes, executor_def)
    followed = followed_projects(chosen) if followed is None else followed
    schedules = refresh_schedules(stages, jobs, lanes, followed)
    return dg.Definitions(
        assets=pipeline_assets(stages),
        jobs=list(jobs.values()),
        schedules=schedules,
        sensors=build_sensors(
            stages,
            jobs,
            lanes,
            chosen,
            ahead=executor_def.name == EXECUTORS[0],
            scheduled=scheduled_projects(schedules, followed),
        ),
        resources={"db": db, "download_client": YtDlpClient(), "models": ModelsResource()},
        executor=executor_def,
    )


# This repository's code location (`dg dev`, `dataminer run`): the settings and the executor of
# the environment, names unprefixed.
SETTINGS = load_settings()
LANES = configured_lanes(SETTINGS)
defs = build_definitions()
