"""The one Definitions object: assets, lane jobs, sensors, resources and the executor.

Cross-cutting policy lives here only.

* Executor: in-process by default. A lane's run executes its stages one after another in the run
  worker, so a run costs one process start, and resources (the run's heartbeat, its claims) are
  set up once, before any step. `DATAMINER_EXECUTOR=multiprocess` gives each step its own process
  (with at most one GPU step at a time within a run); `celery` sends steps to dagster-celery
  workers through their queues (docs/deployment.md). Under both the run worker keeps the run's
  heartbeat (hosting/run_heartbeat.py): its steps' resources start only once a step runs.
* GPU use is bounded by the `gpu` pool (dagster.yaml): filter, dedup and detect take a slot of it
  for the length of their step, across all runs. The op tag `dataminer/device: gpu` only routes
  (the `gpu` celery queue) and, under the multiprocess executor, limits steps within one run.
"""

from __future__ import annotations

import os

import dagster as dg

from dataminer_dagster.engine.jobs import lane_jobs
from dataminer_dagster.engine.lanes import configured_lanes
from dataminer_dagster.engine.stage import lane_assets, stage_assets
from dataminer_dagster.hosting.run_heartbeat import with_run_heartbeat
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import YtDlpClient
from dataminer_dagster.sensors.pipeline_sensors import build_sensors
from dataminer_dagster.settings import EXECUTORS, executor_name, load_settings
from dataminer_dagster.tags import DEVICE_TAG, GPU_OP_TAGS

GPU_LIMIT = [{"key": DEVICE_TAG, "value": GPU_OP_TAGS[DEVICE_TAG], "limit": 1}]


def _executor() -> dg.ExecutorDefinition:
    """DATAMINER_EXECUTOR: in_process (default), multiprocess, or celery for a broker
    (DATAMINER_CELERY_BROKER, default dagster-celery's pyamqp://guest@localhost//) and workers
    per queue."""
    choice = executor_name()
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
    raise ValueError(f"DATAMINER_EXECUTOR={choice!r}: expected one of {', '.join(EXECUTORS)}")


STAGES = stage_assets()
LANE_ASSETS = lane_assets(STAGES)
SETTINGS = load_settings()
LANES = configured_lanes(SETTINGS)
LANE_JOBS = lane_jobs(STAGES, LANES)

defs = dg.Definitions(
    assets=list(LANE_ASSETS.values()),
    jobs=list(LANE_JOBS.values()),
    sensors=build_sensors(STAGES, LANE_JOBS, LANES, SETTINGS),
    resources={"db": DatabaseResource(), "download_client": YtDlpClient()},
    executor=_executor(),
)
