"""A run's heartbeat from its run worker, for the executors that run steps in other processes.

Under the in-process executor the database resource keeps the run's heartbeat row alive from the
run worker itself (resources/db.py). Under `multiprocess` and `celery` that resource is set
up in each step's own process, which Dagster starts only once the step has its `gpu` pool slot (or
a celery worker takes it): a run waiting for a slot longer than `runs.start_grace_s` would be
judged dead by the lease reaper (engine/run_health.py) while its run worker waits, alive. Such
executors are wrapped here so that the run worker beats while it orchestrates, under a row of its
own (`run_health.run_worker_owner`): it keeps a run waiting for its step from being judged dead,
never the leases of a step whose process died (a celery worker killed mid-step).
"""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
from dagster._core.executor.base import Executor

from dataminer_dagster.db.run_leases import RunLeases
from dataminer_dagster.engine.run_health import run_worker_owner
from dataminer_dagster.resources.db import claims_store
from dataminer_dagster.settings import load_settings


def with_run_heartbeat(executor_def: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """`executor_def` (configured or not), its run worker beating for the run."""
    create = executor_def.executor_creation_fn
    assert create is not None, f"executor {executor_def.name} has no creation function"
    return dg.ExecutorDefinition(
        name=executor_def.name,
        config_schema=executor_def.config_schema,
        requirements=executor_def.get_requirements,
        executor_creation_fn=lambda init_context: _Heartbeating(create(init_context)),
        description=executor_def.description,
    )


class _Heartbeating(Executor):
    def __init__(self, inner: Executor):
        self._inner = inner

    @property
    def retries(self):
        return self._inner.retries

    @property
    def step_dependency_config(self):
        return self._inner.step_dependency_config

    def execute(self, plan_context, execution_plan) -> Iterator[dg.DagsterEvent]:
        settings = load_settings()
        heartbeat = RunLeases(
            claims_store(settings),
            run_worker_owner(plan_context.run_id),
            heartbeat_s=settings.lease.heartbeat_s,
            stale_after_s=settings.lease.stale_after_s,
        )
        heartbeat.start()
        try:
            yield from self._inner.execute(plan_context, execution_plan)
        finally:
            heartbeat.stop()
