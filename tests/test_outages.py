"""Outages are not deaths: a database stopped for longer than a lease lives (a restart, a crash)
fails no run and consumes no attempt of a run that beats again, and `dataminer run` waits it out
and ends with the dataset of a clean run. Neither does a session the server ended while its
worker stalled in a transaction, nor a claim whose answer was lost (read back, not made twice).

The database is a PostgreSQL cluster the test starts with `initdb` and stops with `pg_ctl stop -m
fast` or `-m immediate` (tests/helpers/scratch_cluster.py), or a private embedded server.
Heartbeats are 0.5 s and leases go stale after 3 s, so an 8 s outage is more than two leases'
lives.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import psycopg
import psycopg.errors
import pytest
import sqlalchemy as sa
import yaml

from dataminer_dagster.db import migrate
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseLost, LeaseStore
from dataminer_dagster.db.outages import outage_reason, waiting_for_the_database
from dataminer_dagster.db.project_flow import advance_projects
from dataminer_dagster.db.run_leases import RunLeases
from dataminer_dagster.engine.jobs import lane_jobs
from dataminer_dagster.lanes import DEFAULT_LANES
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.sensors.pipeline_sensors import build_sensors
from dataminer_dagster.settings import LeasePolicy, load_settings
from dataminer_dagster.testing import (
    TinyModels,
    instance_for_test,
    sample_project_config,
    write_sample_videos,
)
from tests.helpers.catalog_seed import add_project, seed_videos
from tests.helpers.processes import private_postgres
from tests.helpers.scratch_cluster import scratch_cluster
from tests.helpers.stages import STAGES

pytestmark = pytest.mark.slow

HEARTBEAT_S = 0.5
STALE_S = 3.0
OUTAGE_S = 8.0
LEASE = LeasePolicy(heartbeat_s=HEARTBEAT_S, stale_after_s=STALE_S)
STAGE = "download"


@pytest.fixture(autouse=True)
def _short_leases(monkeypatch):
    monkeypatch.setenv("DATAMINER_HEARTBEAT_SECONDS", str(HEARTBEAT_S))
    monkeypatch.setenv("DATAMINER_LEASE_STALE_SECONDS", str(STALE_S))
    monkeypatch.setenv("DATAMINER_OUTAGE_WAIT_SECONDS", "120")


@dataclass
class Server:
    """A migrated database on a server the test may stop and start again."""

    url: str
    stop: Callable[[], None]
    start: Callable[[], None]


def _migrated(url: str) -> str:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    migrate.upgrade(engine)
    engine.dispose()
    return url


@pytest.fixture(params=["pg_ctl-fast", "pg_ctl-immediate", "embedded"])
def server(request) -> Iterator[Server]:
    if request.param == "embedded":
        with private_postgres() as embedded:
            yield Server(embedded.migrated_database(), embedded.stop, embedded.start)
            from dataminer_dagster.db.engine import dispose_engines

            dispose_engines()
        return
    mode = request.param.removeprefix("pg_ctl-")
    with scratch_cluster() as cluster:
        yield Server(_migrated(cluster.new_database()), lambda: cluster.stop(mode), cluster.start)


# --- what counts as an outage ------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
        psycopg.errors.CannotConnectNow("the database system is starting up"),
        psycopg.errors.CannotConnectNow("the database system is shutting down"),
        psycopg.errors.DiskFull('could not extend file "base/1/2": No space left on device'),
        psycopg.OperationalError("connection failed: Connection refused"),
        psycopg.OperationalError("consuming input failed: server closed the connection"),
        psycopg.errors.IdleInTransactionSessionTimeout(
            "terminating connection due to idle-in-transaction timeout"
        ),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_server_going_away_restarting_or_out_of_disk_is_an_outage(error):
    wrapped = sa.exc.OperationalError("UPDATE ...", {}, error)
    assert outage_reason(wrapped) == str(error)


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.UniqueViolation("duplicate key value violates unique constraint"),
        ValueError("connection refused"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_of_the_work_itself_are_no_outage(error):
    assert outage_reason(sa.exc.OperationalError("UPDATE ...", {}, error)) is None


def test_an_outage_that_comes_and_goes_is_said_once_a_minute(caplog):
    """A database whose disk is full answers reads and refuses writes: its outage ends and begins
    again at every statement, and is said once all the same."""
    from dataminer_dagster.db.outages import Outages

    outages = Outages()
    with caplog.at_level("WARNING", logger="dataminer_dagster.db.outages"):
        for _ in range(5):
            outage = outages.unreachable("could not extend file: No space left on device")
            outages.say(outage, 0.3)
            outages.reachable()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("database unreachable since"), said
    assert said[1].startswith("database reachable again after"), said


def test_a_completion_whose_session_the_server_ended_while_it_stalled_costs_no_attempt():
    """The server ends a session left idle in its transaction for half a lease (db/engine.py), so
    that a worker cut off never holds a row lock for long. A worker merely stalled that long
    inside its completion (a loaded machine, a pause) meets the error at its next statement:
    nothing was recorded, and the item is not to blame. The stage postpones it uncounted, as it
    does an outage (engine/stage_run.py), instead of failing it."""
    with scratch_cluster() as cluster:
        store = LeaseStore(get_engine(_migrated(cluster.new_database()), lease=LEASE))
        store.enqueue(STAGE, ["a"])
        [lease] = store.claim_next(STAGE, "run-a")
        store.mark_started(lease)
        with pytest.raises(sa.exc.DBAPIError) as ended, store.completing(lease) as conn:
            time.sleep(STALE_S / 2 + 1)  # past the server's idle-in-transaction timeout
            conn.execute(sa.text("SELECT 1"))
        assert ended.value.orig.sqlstate == "25P03", ended.value
        assert outage_reason(ended.value) is not None, ended.value
        assert store.postpone(lease, outage_reason(ended.value)).applied
        row = _item(store.engine)
    assert (row.status, row.attempts) == ("failed", 0), row


# --- the reaper judges silence only while the database was up -----------------------------------


def _begun_item(store: LeaseStore, owner: str) -> None:
    store.enqueue(STAGE, ["v0"])
    store.liveness.heartbeat(owner, "host", 1)
    [lease] = store.claim_next(STAGE, owner)
    store.mark_started(lease)


def _item(engine: sa.Engine) -> sa.Row:
    with engine.connect() as c:
        return c.execute(
            sa.text("SELECT status, attempts, lease_owner FROM dataminer.work_items")
        ).one()


def test_a_restart_starts_every_runs_silence_and_start_grace_afresh(server):
    engine = get_engine(server.url)
    store = LeaseStore(engine)
    _begun_item(store, "run-a")
    assert store.liveness.in_status_s([("run-b", "STARTED")]) == {"run-b": pytest.approx(0, abs=1)}
    server.stop()
    time.sleep(STALE_S + 2)
    server.start()

    # The reaper's first look after the restart, before the run could beat again.
    assert store.liveness.reap(STALE_S) == []
    assert store.liveness.heartbeats(["run-a"])["run-a"].age_s < STALE_S
    assert store.liveness.in_status_s([("run-b", "STARTED")])["run-b"] < STALE_S
    row = _item(engine)
    assert (row.status, row.attempts, row.lease_owner) == ("running", 1, "run-a")

    time.sleep(STALE_S + 0.5)  # silent while the database is up: dead, as before
    [reaped] = store.liveness.reap(STALE_S)
    assert reaped.owner == "run-a"


def test_silence_counts_from_the_end_of_an_outage_the_reaper_recorded(engine):
    """A database that stayed up but that no one reached (a network cut): the reaper records the
    outage it met, and no run's silence counts from before its end."""
    store = LeaseStore(engine)
    _begun_item(store, "run-a")
    time.sleep(STALE_S + 0.5)
    store.liveness.record_reaper_pass("reaper on host 1", outage_s=STALE_S + 0.5)
    assert store.liveness.reap(STALE_S) == []
    assert _item(engine).attempts == 1

    store.liveness.record_reaper_pass("reaper on host 1", outage_s=None)  # a pass that met none
    time.sleep(STALE_S + 0.5)
    assert [r.owner for r in store.liveness.reap(STALE_S)] == ["run-a"]


# --- a worker through an outage --------------------------------------------------------------------


def test_a_worker_back_from_an_outage_goes_on_with_its_own_leases_and_abandons_the_rest():
    """Fenced while the database is away, a worker touches nothing; back, it goes on with the
    leases still its own, and one another run took meanwhile is lost to it."""
    with scratch_cluster() as cluster:
        store = LeaseStore(get_engine(_migrated(cluster.new_database()), lease=LEASE))
        store.enqueue(STAGE, ["mine", "taken"])
        leases = RunLeases(
            store, "run-a", heartbeat_s=HEARTBEAT_S, stale_after_s=STALE_S, outage_wait_s=60
        )
        with waiting_for_the_database(LEASE):
            leases.start()
            try:
                mine, taken = sorted(leases.claim_next(STAGE, 2), key=lambda lease: lease.key)
                cluster.stop("fast")
                time.sleep(STALE_S + 1)
                checked: list[BaseException | None] = []

                def check() -> None:
                    try:
                        leases.check(mine)
                        checked.append(None)
                    except BaseException as error:  # noqa: BLE001 - asserted below
                        checked.append(error)

                checking = threading.Thread(target=check)
                checking.start()
                time.sleep(STALE_S)  # more than a lease's life fenced: it waits on
                assert checking.is_alive(), checked
                cluster.start()
                with store.engine.begin() as c:  # another run takes an item meanwhile
                    c.execute(
                        sa.text("""UPDATE dataminer.work_items SET lease_owner = 'run-b',
                                          lease_token = gen_random_uuid()
                                    WHERE item_key = 'taken'""")
                    )
                since_taken = time.monotonic()
                while leases.silent_s() > time.monotonic() - since_taken:  # a beat after it
                    time.sleep(0.1)
                checking.join(30)
                assert checked == [None], "back within outage_wait_s, its own lease goes on"
                with pytest.raises(LeaseLost, match="lease lost"):
                    leases.check(taken)
                assert leases.held == [mine]
            finally:
                leases.stop()


@contextlib.contextmanager
def _commit_answer_lost(admin_url: str, statement: str) -> Iterator[list[int]]:
    """While this lasts, the first COMMIT of `statement` (the start of its text) goes through but
    its answer is lost: every commit waits for a synchronous standby that does not exist, and
    the backend caught waiting ends (pg_terminate_backend), as a server stopping or a network
    cut would end it. Yields the pids of the backends ended."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    ended: list[int] = []
    done = threading.Event()

    def configure(standby: str | None) -> None:
        with admin.connect() as c:
            if standby is None:
                c.execute(sa.text("ALTER SYSTEM RESET synchronous_standby_names"))
            else:
                c.execute(sa.text(f"ALTER SYSTEM SET synchronous_standby_names = '{standby}'"))
            c.execute(sa.text("SELECT pg_reload_conf()"))

    def cut() -> None:
        with admin.connect() as c:
            while not done.is_set() and not ended:
                ended.extend(
                    c.execute(
                        sa.text("""SELECT pid FROM pg_stat_activity
                                    WHERE wait_event = 'SyncRep' AND query LIKE :q
                                      AND pg_terminate_backend(pid)"""),
                        {"q": f"%{statement}%"},
                    ).scalars()
                )
                time.sleep(0.01)
        configure(None)  # the retry's COMMIT goes through

    def until_commits_wait() -> None:
        # The reload reaches the server's processes in a while: a commit of a probe's that waits
        # for the standby says it has (its wait is then cancelled; it committed).
        with admin.connect() as probe, admin.connect() as c:
            pid = probe.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
            while True:
                committing = threading.Thread(
                    target=probe.execute, args=(sa.text("INSERT INTO probe VALUES (1)"),)
                )
                committing.start()
                while committing.is_alive():
                    waits = c.execute(
                        sa.text(
                            "SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = :p"
                        ),
                        {"p": pid},
                    ).scalar()
                    if waits:
                        c.execute(sa.text("SELECT pg_cancel_backend(:p)"), {"p": pid})
                        committing.join(30)
                        return
                    time.sleep(0.01)

    with admin.connect() as c:
        c.execute(sa.text("CREATE TABLE IF NOT EXISTS probe (x int)"))
    configure("nemesis")
    until_commits_wait()
    cutting = threading.Thread(target=cut)
    cutting.start()
    try:
        yield ended
    finally:
        done.set()
        cutting.join(30)
        configure(None)
        admin.dispose()


@pytest.mark.parametrize("how", ["claim_next", "claim_keys"])
def test_a_claim_whose_answer_was_lost_leaves_the_run_no_item_it_does_not_know_of(how):
    """A claim's COMMIT went through but its answer was lost (the backend ended while the
    COMMIT waited). Tried again, the claim must not leave the items the first try took running
    under the run without the run knowing of them: no one would work on them until the run
    ends. The run holds exactly the items it claimed, and gives back the rest uncounted."""
    with scratch_cluster() as cluster:
        store = LeaseStore(get_engine(_migrated(cluster.new_database()), lease=LEASE))
        store.enqueue(STAGE, ["a", "b", "c"])
        leases = RunLeases(
            store, "run-a", heartbeat_s=HEARTBEAT_S, stale_after_s=STALE_S, outage_wait_s=60
        )
        with waiting_for_the_database(LEASE):
            leases.beat()
            with _commit_answer_lost(cluster.url(), "UPDATE dataminer.work_items") as ended:
                if how == "claim_next":
                    claimed = leases.claim_next(STAGE, 2)
                else:
                    claimed, _ = leases.claim_keys(STAGE, ["a", "b"])
            assert ended, "no claim's COMMIT was caught"
            with store.engine.connect() as c:
                rows = c.execute(
                    sa.text("""SELECT item_key, status, attempts, lease_token
                                 FROM dataminer.work_items ORDER BY item_key""")
                ).all()

    running = {r.lease_token for r in rows if r.status == "running"}
    assert {lease.token for lease in claimed} == running, rows
    assert {lease.token for lease in leases.held} == running, rows
    assert {lease.key for lease in claimed} == {"a", "b"}, "the first try's items, read back"
    assert {(r.item_key, r.attempts) for r in rows} == {("a", 1), ("b", 1), ("c", 0)}, rows


def test_a_project_move_whose_answer_was_lost_is_made_once_and_fails_nothing(tmp_path):
    """A run moves the projects its items finished (engine/stage_run.py) as its last step. Its
    COMMIT went through but the answer was lost: the move is tried again, finds the project
    moved, and the run goes on; the next stage is queued once."""
    with scratch_cluster() as cluster:
        engine = get_engine(_migrated(cluster.new_database()), lease=LEASE)
        store = LeaseStore(engine)
        project = add_project(Catalog(engine, store, DataPaths(tmp_path / "data")), "birds")
        seed_videos(engine, project, 3, "b")
        with engine.begin() as c:
            c.execute(sa.text("UPDATE dataminer.work_items SET status = 'done'"))
        with waiting_for_the_database(LEASE):
            with _commit_answer_lost(cluster.url(), "COMMIT") as ended:  # the move's
                advance_projects(store)
            assert ended, "no move's COMMIT was caught"
        with engine.connect() as c:
            stage = c.execute(sa.text("SELECT stage FROM dataminer.projects")).scalar_one()
            queued = c.execute(
                sa.text("SELECT count(*) FROM dataminer.work_items WHERE stage = 'dedup'")
            ).scalar_one()
            notes = c.execute(sa.text("SELECT count(*) FROM dataminer.project_changes")).scalar()

    assert (stage, queued, notes) == ("dedup", 1, 0)


# --- a run and the reaper sensor through an outage -----------------------------------------------

ITEMS = 5
ITEM_S = 1.0  # each item's work


def _worker(url: str, begun: threading.Event) -> dg.JobDefinition:
    """A run that claims every item and works on them one after another, touching the database
    as a stage does: begin, work, complete."""

    @dg.op(required_resource_keys={"db"})
    def work(context) -> None:
        leases = context.resources.db.leases
        for lease in leases.claim_next(STAGE, ITEMS):
            leases.begin(lease)
            begun.set()
            time.sleep(ITEM_S)
            with leases.completing(lease, {"by": context.run_id}):
                pass

    @dg.job(resource_defs={"db": DatabaseResource(database_url=url, heartbeat_seconds=HEARTBEAT_S)})
    def worker():
        work()

    return worker


def test_a_database_stopped_longer_than_a_lease_fails_no_run_and_consumes_no_attempt(
    server, tmp_path, monkeypatch
):
    monkeypatch.setenv("DATAMINER_HOME", str(tmp_path / "home"))
    store = LeaseStore(get_engine(server.url, lease=LEASE))
    store.enqueue(STAGE, [f"v{i}" for i in range(ITEMS)])
    [reaper] = [
        s
        for s in build_sensors(
            STAGES, lane_jobs(STAGES, DEFAULT_LANES), DEFAULT_LANES, load_settings()
        )
        if s.name == "lease_reaper"
    ]
    db = DatabaseResource(database_url=server.url)
    begun = threading.Event()
    ticks: list[str] = []

    def tick() -> None:
        with dg.build_sensor_context(instance=instance, resources={"db": db}) as context:
            result = reaper(context)
        ticks.append(result.skip_message if isinstance(result, dg.SkipReason) else str(result))

    with instance_for_test() as instance:
        outcome: list[dg.ExecuteInProcessResult] = []
        running = threading.Thread(
            target=lambda: outcome.append(
                _worker(server.url, begun).execute_in_process(
                    instance=instance, raise_on_error=False
                )
            )
        )
        running.start()
        assert begun.wait(60), "the run began no item"
        server.stop()
        down_until = time.monotonic() + OUTAGE_S
        while time.monotonic() < down_until:
            tick()
            time.sleep(0.5)
        server.start()
        while running.is_alive():  # the reaper ticks on while the run finishes
            tick()
            time.sleep(0.25)
        for _ in range(int(STALE_S / 0.25) + 2):  # and a lease's life after it
            tick()
            time.sleep(0.25)
        running.join()
        [result] = outcome
        run = instance.get_run_by_id(result.run_id)

    assert any(t.startswith("database unreachable since") for t in ticks), ticks
    assert not any("dead runs" in t or "reaped" in t for t in ticks), ticks
    assert result.success and run.status == dg.DagsterRunStatus.SUCCESS
    with store.engine.connect() as c:
        rows = c.execute(
            sa.text("SELECT item_key, status, attempts, outcome FROM dataminer.work_items")
        ).all()
    assert {(r.status, r.attempts) for r in rows} == {("done", 1)}, rows
    assert {r.outcome["by"] for r in rows} == {result.run_id}


# --- `dataminer run` through an outage -----------------------------------------------------------


_CLI = "from dataminer_dagster.cli import main; main()"


def _dataminer_run(config: Path, home: Path, url: str) -> subprocess.Popen:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATAMINER_", "DAGSTER_HOME"))
    }
    env.update(
        DATAMINER_HOME=str(home),
        DATAMINER_DATA_DIR=str(home / "data"),
        DATAMINER_DATABASE_URL=url,
        DATAMINER_HEARTBEAT_SECONDS="1",
        DATAMINER_LEASE_STALE_SECONDS="4",
        DATAMINER_OUTAGE_WAIT_SECONDS="120",
        DATAMINER_RETRY_BASE_SECONDS="0.2",
        DATAMINER_RETRY_MAX_SECONDS="2",
    )
    return subprocess.Popen(
        [sys.executable, "-c", _CLI, "run", str(config), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _dataset(config: dict) -> pd.DataFrame:
    manifest = pd.read_parquet(Path(config["output_dir"]) / "dataset" / "manifest.parquet")
    columns = ["file_name", "video_id", "frame_index", "timestamp", "group", "group_size"]
    return manifest[columns].sort_values("file_name").reset_index(drop=True)


def _project(tmp_path: Path, name: str, clips: list[Path], models: TinyModels) -> tuple[Path, dict]:
    config = sample_project_config(
        "outage", models=models, output_dir=tmp_path / name / "out", files=clips
    )
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, config


def _done(url: str, stage: str) -> int:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as c:
            return c.execute(
                sa.text(
                    "SELECT count(*) FROM dataminer.work_items WHERE stage = :s AND status = 'done'"
                ),
                {"s": stage},
            ).scalar_one()
    except sa.exc.ProgrammingError:  # the schema is not there yet
        return 0
    finally:
        engine.dispose()


def test_dataminer_run_waits_out_a_stopped_database_and_ends_with_the_clean_runs_dataset(
    tmp_path, tiny_siglip, tiny_yolo
):
    models = TinyModels(tiny_siglip, tiny_yolo)
    clips = write_sample_videos(tmp_path / "clips", 3)
    with scratch_cluster() as cluster:
        clean_config, clean = _project(tmp_path, "clean", clips, models)
        clean_url = cluster.new_database()
        done = _dataminer_run(clean_config, tmp_path / "clean-home", clean_url)
        output, _ = done.communicate(timeout=600)
        assert done.returncode == 0, output

        config_path, config = _project(tmp_path, "outage", clips, models)
        url = cluster.new_database()
        process = _dataminer_run(config_path, tmp_path / "outage-home", url)
        try:
            deadline = time.monotonic() + 300
            while _done(url, "frames") < 1:
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "no frames done in 300 s"
                time.sleep(0.2)
            cluster.stop("fast")
            time.sleep(12)
            cluster.start()
            output, _ = process.communicate(timeout=600)
        finally:
            if process.poll() is None:
                process.kill()
        engine = sa.create_engine(url, poolclass=sa.NullPool)
        with engine.connect() as c:
            attempts = c.execute(
                sa.text("SELECT stage, item_key, status, attempts FROM dataminer.work_items")
            ).all()
        engine.dispose()

    assert process.returncode == 0, output
    assert "database unreachable since" in output, output
    assert "Traceback" not in output, output
    assert {(r.status, r.attempts) for r in attempts} == {("done", 1)}, attempts
    pd.testing.assert_frame_equal(_dataset(config), _dataset(clean))


def test_dataminer_run_started_while_the_database_is_down_waits_for_it(
    tmp_path, tiny_siglip, tiny_yolo
):
    """Started by a service manager while the database restarts, `dataminer run` waits for it
    from its first connection on (the schema migrated, the project registered) and says so in one
    line, instead of ending at once."""
    clips = write_sample_videos(tmp_path / "clips", 2)
    config_path, config = _project(tmp_path, "down", clips, TinyModels(tiny_siglip, tiny_yolo))
    with scratch_cluster() as cluster:
        url = cluster.new_database()  # empty: the run migrates it once it is up
        cluster.stop("fast")
        process = _dataminer_run(config_path, tmp_path / "home", url)
        lines: list[str] = []
        reading = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reading.start()
        try:
            deadline = time.monotonic() + 300
            while not any("database unreachable since" in line for line in lines):
                assert process.poll() is None, "".join(lines)
                assert time.monotonic() < deadline, "".join(lines)
                time.sleep(0.2)
            time.sleep(3)  # a few tries later
            assert process.poll() is None, "".join(lines)
            cluster.start()
            process.wait(timeout=600)
            reading.join(30)
        finally:
            if process.poll() is None:
                process.kill()
        output = "".join(lines)

    assert process.returncode == 0, output
    assert output.count("database unreachable since") == 1, output
    assert "Traceback" not in output, output
    assert "project outage: complete" in output, output
    assert len(_dataset(config)) > 0
