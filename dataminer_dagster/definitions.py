"""The one Definitions object: assets, sensors, resources and the executor.

Cross-cutting policy lives here only. GPU stages (filter, dedup, detect) carry the op tag
`dataminer/device: gpu` and the `gpu` pool: the executor runs one of them at a time within a run,
the pool one at a time across runs (dagster.yaml). The same tags route them to a `gpu` queue under
dagster-celery (`dagster-celery/queue: gpu`); see docs/deployment.md.
"""

from __future__ import annotations

import os

import dagster as dg

from dataminer_dagster.assets import STAGE_ASSETS
from dataminer_dagster.resources.database import DatabaseResource
from dataminer_dagster.resources.video_sources import YtDlpSources
from dataminer_dagster.sensors.pipeline_sensors import build_sensors, stage_jobs

GPU_LIMIT = [{"key": "dataminer/device", "value": "gpu", "limit": 1}]


def _executor() -> dg.ExecutorDefinition:
    """multiprocess by default; DATAMINER_EXECUTOR=celery for a broker (DATAMINER_CELERY_BROKER,
    default dagster-celery's pyamqp://guest@localhost//) and workers per queue."""
    if os.environ.get("DATAMINER_EXECUTOR", "multiprocess") == "celery":
        from dagster_celery import celery_executor

        broker = os.environ.get("DATAMINER_CELERY_BROKER")
        return celery_executor.configured({"broker": broker}) if broker else celery_executor
    return dg.multiprocess_executor.configured({"tag_concurrency_limits": GPU_LIMIT})


STAGE_JOBS = stage_jobs(STAGE_ASSETS)

defs = dg.Definitions(
    assets=list(STAGE_ASSETS.values()),
    jobs=list(STAGE_JOBS.values()),
    sensors=build_sensors(STAGE_ASSETS, STAGE_JOBS),
    resources={"db": DatabaseResource(), "video_sources": YtDlpSources()},
    executor=_executor(),
)
