"""Steps routed through dagster-celery to the worker of their queue, with a real broker.

How the run is launched, and why: the Celery executor ships each step to a worker as a
`ReconstructableJob` plus an `InstanceRef`, so it cannot run under `execute_in_process` or
`materialize` (no reconstructable job, an in-memory instance). `dg.execute_job` with
`build_reconstructable_job` runs the orchestration loop in the test process, against a persistent
Postgres-backed instance (DAGSTER_HOME with the repository's dagster.yaml, on this test's
database), while every step executes in a `dagster-celery worker start` subprocess that rebuilds
the same job from this module.

Queue names get a per-test suffix: several test sessions (and both database servers under
`pytest -n 3`) share one broker, and a worker of another session must not take our steps. The real
queue names (`dagster`, `gpu`) and the pipeline's tags are checked separately, without a broker.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml

from tests.helpers.processes import stop_group

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN_DIR = Path(sys.executable).parent
ITEMS = dg.DynamicPartitionsDefinition(name="celery_items")
WORKER_ROLE_ENV = "DATAMINER_TEST_WORKER_ROLE"
QUEUE_TAG = "dagster-celery/queue"  # dagster_celery.tags.DAGSTER_CELERY_QUEUE_TAG


def _record(record_dir: str, context: dg.AssetExecutionContext) -> None:
    """Leave proof of which worker process materialized each partition."""
    out = Path(record_dir) / context.asset_key.to_user_string()
    out.mkdir(parents=True, exist_ok=True)
    for key in context.partition_keys:
        (out / f"{key}.json").write_text(
            json.dumps({"role": os.environ.get(WORKER_ROLE_ENV), "pid": os.getpid()})
        )


def routing_job(gpu_queue: str, record_dir: str) -> dg.JobDefinition:
    """Two batched, dynamically partitioned assets, like the pipeline's `frames` ->
    `filtered_frames`: the second carries the pipeline's GPU op tags and pool, with the test's
    queue name. Rebuilt by every worker from these arguments (see `build_reconstructable_job`)."""
    from dagster_celery import celery_executor

    from dataminer_dagster.tags import GPU_OP_TAGS

    @dg.asset(partitions_def=ITEMS, backfill_policy=dg.BackfillPolicy.single_run())
    def decoded(context) -> None:
        _record(record_dir, context)

    @dg.asset(
        partitions_def=ITEMS,
        backfill_policy=dg.BackfillPolicy.single_run(),
        deps=[decoded],
        op_tags={**GPU_OP_TAGS, QUEUE_TAG: gpu_queue},
        pool="gpu",
    )
    def scored(context) -> None:
        _record(record_dir, context)

    defs = dg.Definitions(
        assets=[decoded, scored],
        jobs=[dg.define_asset_job("celery_routing", partitions_def=ITEMS)],
        executor=celery_executor,
    )
    return defs.resolve_job_def("celery_routing")


# --- without a broker ---------------------------------------------------------------------------


def test_pipeline_gpu_assets_route_to_the_queue_the_services_start_workers_for():
    from dagster_celery.tags import DAGSTER_CELERY_QUEUE_TAG

    from dataminer_dagster.hosting.supervisord import GPU_QUEUE
    from tests.helpers.stages import LANE_ASSETS

    assert QUEUE_TAG == DAGSTER_CELERY_QUEUE_TAG
    queues = {
        key.to_user_string(): asset.op.tags.get(QUEUE_TAG)
        for asset in LANE_ASSETS.values()
        for key in asset.keys
    }
    assert {a for a, q in queues.items() if q == GPU_QUEUE} >= {
        "filtered_frames",
        "deduped_set",
        "detections",
    }
    assert queues["downloads"] is None and queues["frames"] is None  # the default queue


# --- with a broker ------------------------------------------------------------------------------


def _broker_candidates() -> list[str]:
    if os.environ.get("DATAMINER_TEST_CELERY_BROKER"):
        return [os.environ["DATAMINER_TEST_CELERY_BROKER"]]
    found = ["pyamqp://guest:guest@127.0.0.1:5672//"]
    try:
        import redis  # noqa: F401  (kombu's Redis transport needs it)

        found.append("redis://127.0.0.1:6379/0")
    except ImportError:
        pass
    return found


@pytest.fixture(scope="module")
def broker() -> str:
    from kombu import Connection

    problems = []
    for url in _broker_candidates():
        try:
            with Connection(url, connect_timeout=2) as conn:
                conn.ensure_connection(max_retries=1)
            return url
        except Exception as exc:
            problems.append(f"{url}: {exc}")
    pytest.skip(f"no Celery broker answers ({'; '.join(problems)})")


def _backend(broker_url: str) -> str:
    return "rpc://" if broker_url.startswith(("amqp", "pyamqp")) else broker_url


@contextmanager
def _celery_workers(
    roles: dict[str, str], *, broker_url: str, config_yaml: Path, env: dict[str, str], logs: Path
) -> Iterator[dict[str, str]]:
    """One `dagster-celery worker start` per role -> queue. Yields role -> Celery node name."""
    host = socket.gethostname()
    token = uuid.uuid4().hex[:6]
    nodes = {role: f"{role}-{token}" for role in roles}
    procs: list[subprocess.Popen] = []
    try:
        for role, queue in roles.items():
            log = (logs / f"{role}.log").open("w")
            procs.append(
                subprocess.Popen(
                    [
                        str(BIN_DIR / "dagster-celery"),
                        "worker",
                        "start",
                        "-A",
                        "dagster_celery.app",
                        "-y",
                        str(config_yaml),
                        "-q",
                        queue,
                        "-n",
                        nodes[role],
                        "--",
                        "--concurrency=1",
                        "--without-gossip",
                        "--without-mingle",
                    ],
                    cwd=REPO_ROOT,
                    env={**env, WORKER_ROLE_ENV: role},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: `celery` is a grandchild
                )
            )
        _wait_until_ready(broker_url, [f"{n}@{host}" for n in nodes.values()], procs, logs)
        yield {role: f"{node}@{host}" for role, node in nodes.items()}
    finally:
        for proc in procs:
            stop_group(proc)


def _wait_until_ready(broker_url: str, nodes: list[str], procs, logs: Path) -> None:
    from dagster_celery.make_app import make_app

    app = make_app({"broker": broker_url, "backend": _backend(broker_url)})
    deadline = time.monotonic() + 120
    answered: set[str] = set()
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break
        for reply in app.control.ping(destination=nodes, timeout=1.0):
            answered.update(reply)
        if answered >= set(nodes):
            return
    tails = "\n".join(f"--- {f.name}\n{f.read_text()[-3000:]}" for f in sorted(logs.glob("*.log")))
    raise AssertionError(f"Celery workers {sorted(set(nodes) - answered)} never answered:\n{tails}")


def _delete_queues(broker_url: str, queues: list[str]) -> None:
    """Celery declares a queue and an exchange of the same name for each queue it meets."""
    from kombu import Connection

    with Connection(broker_url, connect_timeout=2) as conn:
        channel = conn.default_channel
        for name in queues:
            channel.queue_delete(name)
            channel.exchange_delete(name)


def _executing_worker_by_step(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """step key -> Celery node name, from the engine event each worker writes when it starts a
    step ("Executing steps X in celery worker")."""
    found = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        metadata = entry.dagster_event.engine_event_data.metadata
        if "Celery worker" in metadata:
            found[entry.dagster_event.step_key] = metadata["Celery worker"].value
    return found


def _submitted_queue_by_step(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    found = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        message = entry.dagster_event.message or ""
        if message.startswith("Submitting celery task"):
            found[entry.dagster_event.step_key] = message.rsplit('"', 2)[-2]
    return found


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(300)
# dagster-celery registers its task again for every step it submits; harmless.
@pytest.mark.filterwarnings("ignore::celery.exceptions.DuplicateTaskNameWarning")
def test_each_step_runs_on_the_worker_of_its_queue(broker, dataminer_env, tmp_path):
    token = uuid.uuid4().hex[:8]
    queues = {"cpu": f"dagster-{token}", "gpu": f"gpu-{token}"}
    record_dir = tmp_path / "records"
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    executor_config = {
        "broker": broker,
        "backend": _backend(broker),
        # Steps without a queue tag go to the default queue: ours, not the shared `dagster`.
        "config_source": {"task_default_queue": queues["cpu"]},
    }
    config_yaml = tmp_path / "celery.yaml"
    config_yaml.write_text(yaml.safe_dump({"execution": {"config": executor_config}}))
    worker_env = {
        **os.environ,  # DATAMINER_DATABASE_URL and DATAMINER_HOME from `dataminer_env`
        "DAGSTER_HOME": str(dagster_home),
        "PATH": os.pathsep.join([str(BIN_DIR), os.environ.get("PATH", "")]),
    }
    job = dg.build_reconstructable_job(
        "tests.test_celery",
        "routing_job",
        reconstructable_kwargs={"gpu_queue": queues["gpu"], "record_dir": str(record_dir)},
        reconstructor_working_directory=str(REPO_ROOT),
    )
    keys = ["v1", "v2", "v3"]

    # The instance creates Dagster's tables in this test's database before any worker starts.
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        instance.add_dynamic_partitions(ITEMS.name, keys)
        try:
            with _celery_workers(
                queues,
                broker_url=broker,
                config_yaml=config_yaml,
                env=worker_env,
                logs=tmp_path,
            ) as nodes:
                result = dg.execute_job(
                    job,
                    instance=instance,
                    run_config={"execution": {"config": executor_config}},
                    tags={
                        "dagster/asset_partition_range_start": keys[0],
                        "dagster/asset_partition_range_end": keys[-1],
                    },
                )
                run_id = result.run_id
                assert result.success, _run_failure(instance, run_id)
        finally:
            _delete_queues(broker, list(queues.values()))

        assert _submitted_queue_by_step(instance, run_id) == {
            "decoded": queues["cpu"],
            "scored": queues["gpu"],
        }
        assert _executing_worker_by_step(instance, run_id) == {
            "decoded": nodes["cpu"],
            "scored": nodes["gpu"],
        }
        materialized = instance.get_materialized_partitions(dg.AssetKey("scored"))
        assert materialized == set(keys)

    records = {
        (asset, key): json.loads((record_dir / asset / f"{key}.json").read_text())
        for asset in ("decoded", "scored")
        for key in keys
    }
    assert {asset: r["role"] for (asset, _), r in records.items()} == {
        "decoded": "cpu",
        "scored": "gpu",
    }
    pids = {asset: r["pid"] for (asset, _), r in records.items()}
    assert len({pids["decoded"], pids["scored"], os.getpid()}) == 3


def _run_failure(instance: dg.DagsterInstance, run_id: str) -> str:
    failures = [
        e.dagster_event.message
        for e in instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.is_failure
    ]
    return "the run failed:\n" + "\n".join(m or "" for m in failures)
