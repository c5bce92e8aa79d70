"""Crashing, blocking and restarting things in the middle of a run, for the recovery tests.

* `HookedDatabase` is the claim-store resource with hooks. At a chosen item of a stage (the n-th
  item this process handles, or the item with a given key) and a chosen point of its life, it
  SIGKILLs its own process, waits for a file to appear, or restarts PostgreSQL:
    - "claimed":    the run holds the lease and has not begun the item (its loss costs no attempt)
    - "processed":  the stage function returned; its outputs are staged, nothing is published
    - "publishing": the outputs are published and recorded, the transaction is not committed
* `start_stage_run` runs one stage's job for some partitions in a separate process (this module's
  command line), on a Dagster instance kept in a directory that the test shares with it.
* `PrivatePostgres` is an embedded PostgreSQL of the test's own, which it may stop and restart.

Nothing here touches product code: the hooks sit in a resource subclass, as tests swap resources.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from dataminer_dagster.db.leases import Lease
from dataminer_dagster.db.run_leases import RunLeases
from dataminer_dagster.lanes import lane_of
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.tags import LANE_TAG, RANGE_END, RANGE_START, REQUESTED_BY_TAG, STAGES_TAG

REPO_ROOT = Path(__file__).resolve().parents[2]
PHASES = ("claimed", "processed", "publishing")


@dataclass(frozen=True)
class Hook:
    stage: str
    phase: str  # one of PHASES
    action: str  # kill | wait | restart_postgres
    index: int | None = None  # the n-th item (0-based) of `stage` that this process handles ...
    key: str | None = None  # ... or the item with this key, every time
    path: str | None = None  # kill: where to record what the run held; wait: the file to wait for
    pgdata: str | None = None  # restart_postgres: the server to restart
    down_s: float = 0.0  # restart_postgres: how long the server stays down
    once: bool = False  # fire at most once in this process, whatever the runs and items

    def matches(self, lease: Lease, phase: str, index: int) -> bool:
        if (self.stage, self.phase) != (lease.stage, phase):
            return False
        return lease.key == self.key if self.key is not None else index == self.index


def dump_hooks(hooks: Sequence[Hook]) -> str:
    return json.dumps([asdict(h) for h in hooks])


_FIRED_IN_PROCESS: set[str] = set()


def _hook_id(raw: dict) -> str:
    return json.dumps(raw, sort_keys=True)


class HookedDatabase(DatabaseResource):
    """DatabaseResource whose run leases fire `hooks` (JSON, see `dump_hooks`)."""

    hooks: str = "[]"

    _order: dict = PrivateAttr(default_factory=dict)  # stage -> lease tokens in the order seen
    _claimed: set = PrivateAttr(default_factory=set)  # leases whose "claimed" point has passed
    _begun: set = PrivateAttr(default_factory=set)  # (stage, key) of the items begun
    # Held by a kill while it records the items begun, so that no other thread (a stage working
    # on several items at once) begins one between the record and the kill.
    _beginning: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @property
    def leases(self) -> RunLeases:
        return _HookedLeases(DatabaseResource.leases.fget(self), self)

    def fire(self, leases: RunLeases, lease: Lease, phase: str) -> None:
        if phase == "claimed":
            if lease.token in self._claimed:  # checked again later (between units of work)
                return
            self._claimed.add(lease.token)
        seen = self._order.setdefault(lease.stage, [])
        if lease.token not in seen:
            seen.append(lease.token)
        index = seen.index(lease.token)
        for raw in json.loads(self.hooks):
            hook = Hook(**raw)
            if not hook.matches(lease, phase, index):
                continue
            if hook.once:
                if _hook_id(raw) in _FIRED_IN_PROCESS:
                    continue
                _FIRED_IN_PROCESS.add(_hook_id(raw))
            if hook.action == "kill":
                with self._beginning:
                    _kill(hook, leases, lease, begun=self._begun)
            else:
                _ACTIONS[hook.action](hook, leases, lease)

    def begin(self, leases: RunLeases, lease: Lease) -> None:
        with self._beginning:
            leases.begin(lease)
            self._begun.add((lease.stage, lease.key))


class _HookedLeases:
    """The run's RunLeases, with the hooks called at the three points of an item's life."""

    def __init__(self, real: RunLeases, resource: HookedDatabase):
        self._real = real
        self._resource = resource

    def __getattr__(self, name):
        return getattr(self._real, name)

    def begin(self, lease: Lease) -> None:
        self._resource.fire(self._real, lease, "claimed")
        self._resource.begin(self._real, lease)

    def check(self, lease: Lease) -> None:
        self._resource.fire(self._real, lease, "claimed")
        self._real.check(lease)

    @contextmanager
    def completing(self, lease: Lease, outcome: dict | None = None):
        self._resource.fire(self._real, lease, "processed")
        with self._real.completing(lease, outcome) as conn:
            yield conn
            self._resource.fire(self._real, lease, "publishing")


# --- actions -------------------------------------------------------------------------------------


def _kill(hook: Hook, leases: RunLeases, lease: Lease, begun: set[tuple[str, str]]) -> None:
    """Record what the run holds and which of those items it has begun (several, where a stage
    works on some at once), then die the way an OOM kill or a segfault does."""
    held = sorted([h.stage, h.key] for h in leases.held)
    record = {
        "stage": lease.stage,
        "key": lease.key,
        "phase": hook.phase,
        "run_id": leases.owner,
        "held": held,
        "begun": [h for h in held if tuple(h) in begun],
    }
    if hook.path:
        _write_atomically(Path(hook.path), json.dumps(record))
    os.kill(os.getpid(), signal.SIGKILL)


def _wait(hook: Hook, leases: RunLeases, lease: Lease) -> None:
    """Announce the claim (`<path>.waiting` holds the run id), then wait for `<path>`."""
    target = Path(hook.path)
    _write_atomically(target.with_name(target.name + ".waiting"), leases.owner)
    deadline = time.monotonic() + 120
    while not target.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{target} did not appear")
        time.sleep(0.05)


def _restart_postgres(hook: Hook, leases: RunLeases, lease: Lease) -> None:
    PrivatePostgres.running(hook.pgdata).restart(down_s=hook.down_s)


_ACTIONS = {"wait": _wait, "restart_postgres": _restart_postgres}  # and "kill", in fire


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


# --- a stage's job in another process --------------------------------------------------------------


def range_tags(instance: dg.DagsterInstance, partitions_name: str, keys: Sequence[str]) -> dict:
    order = instance.get_dynamic_partitions(partitions_name)
    wanted = sorted(keys, key=order.index)
    return {RANGE_START: wanted[0], RANGE_END: wanted[-1]}


@dataclass(frozen=True)
class StageRun:
    """One stage's job over `keys`, in its own process, on the instance in `instance_dir`."""

    stage: str
    keys: list[str]
    database_url: str
    data_dir: str
    instance_dir: str
    result_path: str
    hooks: str = "[]"
    heartbeat_s: float = 0.5
    by_sensor: bool = True


@dataclass(frozen=True)
class Finished:
    returncode: int
    output: str
    result: dict | None  # run_id, success, materialized (None when the process died)

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def start_stage_run(spec: StageRun) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.processes", json.dumps(asdict(spec))],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen, spec: StageRun, timeout_s: float = 180) -> Finished:
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        raise AssertionError(
            f"{spec.stage} run did not end in {timeout_s} s:\n{output[-4000:]}"
        ) from None
    path = Path(spec.result_path)
    result = json.loads(path.read_text()) if path.exists() else None
    return Finished(process.returncode, output[-4000:], result)


def run_batches_at_once(
    stage: str,
    partitions_name: str,
    batches: Sequence[Sequence[str]],
    *,
    database_url: str,
    data_dir: Path,
    work_dir: Path,
    timeout_s: float,
) -> list[Finished]:
    """One run of `stage` per batch, all at once, each in its own process with its own Dagster
    instance (under `work_dir`); what each run left when it ended."""
    specs = []
    for n, batch in enumerate(batches):
        instance_dir = work_dir / f"instance-{n}"
        instance_dir.mkdir()
        with dg.instance_for_test(temp_dir=str(instance_dir)) as instance:
            instance.add_dynamic_partitions(partitions_name, list(batch))
        specs.append(
            StageRun(
                stage=stage,
                keys=list(batch),
                database_url=database_url,
                data_dir=str(data_dir),
                instance_dir=str(instance_dir),
                result_path=str(work_dir / f"result-{n}.json"),
                by_sensor=False,
            )
        )
    processes = [start_stage_run(spec) for spec in specs]
    return [finish(p, spec, timeout_s=timeout_s) for p, spec in zip(processes, specs, strict=True)]


def run_stage_job(spec: StageRun) -> None:
    from tests.helpers.pipeline import CannedSearchClient, recorded_as_current
    from tests.helpers.stages import PIPELINE_ASSETS, STAGES

    asset = STAGES[spec.stage]
    job = dg.define_asset_job(f"{spec.stage}_only", selection=[asset.key])
    defs = dg.Definitions(
        assets=PIPELINE_ASSETS,
        jobs=[job],
        executor=dg.in_process_executor,
        resources={
            "db": HookedDatabase(
                database_url=spec.database_url,
                data_dir=spec.data_dir,
                heartbeat_seconds=spec.heartbeat_s,
                hooks=spec.hooks,
            ),
            "download_client": CannedSearchClient(),
            "models": ModelsResource(),
        },
    )
    with dg.instance_for_test(temp_dir=spec.instance_dir) as instance:
        tags = {
            **range_tags(instance, asset.partitions_def.name, spec.keys),
            LANE_TAG: lane_of(spec.stage).name,
            STAGES_TAG: spec.stage,
        }
        if spec.by_sensor:
            tags[REQUESTED_BY_TAG] = "sensor"
        result = defs.resolve_job_def(job.name).execute_in_process(
            instance=instance, tags=tags, raise_on_error=False
        )
        materialized = sorted(
            e.event_specific_data.materialization.partition
            for e in result.get_asset_materialization_events()
            if not recorded_as_current(e)
        )
    _write_atomically(
        Path(spec.result_path),
        json.dumps(
            {"run_id": result.run_id, "success": result.success, "materialized": materialized}
        ),
    )


# --- a PostgreSQL of the test's own ----------------------------------------------------------------


class PrivatePostgres:
    """An embedded server that only this test uses, so that it may be stopped and restarted."""

    _running: dict[str, PrivatePostgres] = {}

    def __init__(self):
        from dataminer_dagster.db.server import pgserver_handle

        # Not under pytest's tmp dir (see conftest): the server runs as its own system user.
        self.root = Path(tempfile.mkdtemp(prefix="dataminer-test-restart-"))
        self.server = pgserver_handle(self.root / "pg", cleanup_mode="stop")
        self.pgdata = str(self.server.pgdata)
        self.uri = self.server.get_uri()
        PrivatePostgres._running[self.pgdata] = self

    @classmethod
    def running(cls, pgdata: str) -> PrivatePostgres:
        return cls._running[pgdata]

    def url(self, database: str) -> str:
        from dataminer_dagster.db.server import with_driver

        return with_driver(self.server.get_uri(database), "psycopg")

    def migrated_database(self, name: str = "dataminer") -> str:
        """Create the database `name`, apply the migrations, and return its URL."""
        import sqlalchemy as sa

        from dataminer_dagster.db import migrate

        admin = sa.create_engine(
            self.url("postgres"), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        with admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        engine = sa.create_engine(self.url(name), poolclass=sa.NullPool)
        migrate.upgrade(engine)
        engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        with self.server._lock:  # the package's own inter-process lock around start-up
            self.server.ensure_postgres_running()
        if self.server.get_uri() != self.uri:
            raise RuntimeError(f"the restarted server moved: {self.server.get_uri()} != {self.uri}")

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def close(self) -> None:
        import shutil

        PrivatePostgres._running.pop(self.pgdata, None)
        self.server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        yield server
    finally:
        server.close()


if __name__ == "__main__":
    run_stage_job(StageRun(**json.loads(sys.argv[1])))


def stop_group(process: subprocess.Popen, timeout_s: float = 20) -> None:
    """End a process started in a session of its own, with its children: SIGTERM to the group,
    SIGKILL after `timeout_s`."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
