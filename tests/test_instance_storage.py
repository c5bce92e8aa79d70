"""The repository's dagster.yaml: Dagster's own storage on the embedded PostgreSQL by default, with
no external service, and its history kept across a restart of that server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from dataminer_dagster.db import migrate
from dataminer_dagster.db.server import stop_embedded, with_driver
from dataminer_dagster.settings import load_settings
from tests.helpers.statements import statements_sent

REPO = Path(__file__).resolve().parents[1]


# Each part runs in a process of its own, as `dagster dev` before and after a restart would.
_MATERIALIZE = """
import sys, dagster as dg
@dg.asset
def greeting() -> str:
    return "hello"
instance = dg.DagsterInstance.from_config(sys.argv[1])
assert instance.run_storage.postgres_url.startswith("postgresql")
print(dg.materialize([greeting], instance=instance).run_id)
instance.dispose()
"""
_HISTORY = """
import sys, dagster as dg
instance = dg.DagsterInstance.from_config(sys.argv[1])
event = instance.get_latest_materialization_event(dg.AssetKey("greeting"))
print(*[f"{run.run_id} {run.status.value}" for run in instance.get_runs()], event.run_id)
instance.dispose()
"""


def _python(code: str, dagster_home: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, str(dagster_home)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture
def embedded_home(monkeypatch, tmp_path: Path):
    """DAGSTER_HOME with the repository's dagster.yaml, DATAMINER_HOME of its own, no database URL:
    the instance must start the embedded server itself."""
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    shutil.copy(REPO / "dagster.yaml", dagster_home / "dagster.yaml")
    # Not under pytest's tmp dir, which another session may lock (see conftest.py).
    dataminer_home = Path(tempfile.mkdtemp(prefix="dataminer-test-home-"))
    monkeypatch.setenv("DATAMINER_HOME", str(dataminer_home))
    for name in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    yield dagster_home
    stop_embedded(load_settings())
    shutil.rmtree(dataminer_home, ignore_errors=True)


def test_dagster_history_survives_a_restart_of_the_embedded_server(embedded_home):
    run_id = _python(_MATERIALIZE, embedded_home).splitlines()[-1]
    settings = load_settings()
    assert stop_embedded(settings), "the instance started the embedded server"
    assert not (settings.embedded_pgdata / "postmaster.pid").exists()

    history = _python(_HISTORY, embedded_home).splitlines()[-1]  # starts the server again
    assert history == f"{run_id} SUCCESS {run_id}"


def test_dagster_tables_and_claim_tables_share_the_server_in_their_own_schemas(embedded_home):
    instance = dg.DagsterInstance.from_config(str(embedded_home))
    try:
        url = instance.run_storage.postgres_url
    finally:
        instance.dispose()
    engine = sa.create_engine(with_driver(url, "psycopg"))
    migrate.upgrade(engine)
    with engine.connect() as c:
        schemas = dict(
            c.execute(
                sa.text("""SELECT table_name, table_schema FROM information_schema.tables
                            WHERE table_name IN ('runs', 'event_logs', 'work_items')""")
            ).all()
        )
    engine.dispose()
    assert schemas == {"runs": "public", "event_logs": "public", "work_items": "dataminer"}


@dg.asset
def counted() -> int:
    return 1


def _backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as c:
        return c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def _server_backends(engine: sa.Engine) -> set[int]:
    """Backend pids of the server's client connections (this one included)."""
    with engine.connect() as c:
        query = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
        return set(c.execute(sa.text(query)).scalars())


def test_dagster_storages_share_one_pool_that_survives_a_restart_and_a_fork(embedded_home):
    # dagster-postgres alone opens a connection per storage operation; ours pool them per process.
    instance = dg.DagsterInstance.from_config(str(embedded_home))
    try:
        engine = instance.run_storage._engine
        assert instance.event_log_storage._engine is engine
        assert instance.schedule_storage._engine is engine
        connects = []
        sa.event.listen(engine, "connect", lambda *_: connects.append(1))
        for _ in range(3):
            assert dg.materialize([counted], instance=instance).success
        # three runs write dozens of events and run records: about one connection per operation
        # before, now only what the run's threads hold at once
        assert len(connects) <= 4, len(connects)

        # a restart of the database costs no failed operation: the pool checks before use
        settings = load_settings()
        assert stop_embedded(settings)
        from dataminer_dagster.db.server import dagster_database_url

        assert dagster_database_url(settings) == instance.run_storage.postgres_url  # started again
        assert dg.materialize([counted], instance=instance).success
        assert len(instance.get_runs()) == 4

        # a forked child does not share the parent's pooled connections (their sockets)
        parent_backends = _server_backends(engine)  # this server serves this process alone
        assert _backend_pid(engine) in parent_backends
        child = os.fork()
        if child == 0:  # pragma: no cover (the child's result is its exit status)
            code = 1
            try:
                runs = len(instance.get_runs())
                code = 0 if _backend_pid(engine) not in parent_backends and runs == 4 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child reused the parent's connection"
        assert _backend_pid(engine) in parent_backends  # the parent's pool is intact
        assert len(instance.get_runs()) == 4
    finally:
        instance.dispose()


def _looks_for_tables(call) -> list[str]:
    """The statements that list the database's tables (SQLAlchemy's `get_table_names`), sent by
    any engine of this process while `call` runs."""
    sent = statements_sent(sa.engine.Engine, call)
    return [s for s, _ in sent if "pg_catalog.pg_class" in s and "relkind" in s]


def test_an_instance_built_again_in_a_process_does_not_look_for_dagsters_tables(
    dataminer_env, tmp_path, database_url
):
    """Dagster's storages list the database's tables, each on a new connection, whenever one is
    built (50-200 ms of each tick under dagster-daemon). The first instance of a process on a
    database makes Dagster's tables; later ones neither look for them nor miss them."""
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    instances: list[dg.DagsterInstance] = []

    def build() -> None:
        instances.append(dg.DagsterInstance.from_config(str(tmp_path)))

    assert _looks_for_tables(build), "the first instance looked for Dagster's tables, and made them"
    with sa.create_engine(database_url).connect() as c:
        assert {"runs", "event_logs", "jobs"} <= set(sa.inspect(c).get_table_names())

    assert _looks_for_tables(build) == []
    instance = instances[-1]
    instance.add_dynamic_partitions("videos", ["v1"])
    assert instance.get_dynamic_partitions("videos") == ["v1"]
    assert instance.get_runs() == []
    for built in instances:
        built.dispose()


def test_a_failure_nobody_described_keeps_its_stack(dataminer_env, tmp_path: Path):
    """The storage keeps a `dagster.Failure` as its words alone (hosting/described_failures.py);
    an exception nobody described is a fault to debug, and keeps its stack."""

    @dg.asset
    def crashing():
        raise RuntimeError("a fault")

    shutil.copy(REPO / "dagster.yaml", tmp_path)
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        result = dg.materialize([crashing], instance=instance, raise_on_error=False)
        [failure] = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    finally:
        instance.dispose()
    error = failure.get_dagster_event().step_failure_data.error
    assert error.cause.message.startswith("RuntimeError: a fault") and error.cause.stack
