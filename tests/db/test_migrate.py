"""Schema setup under concurrency: many threads and processes on fresh and migrated databases, a
holder of the migration lock killed, and no lock taken once the schema is at head."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import threading
import time

import sqlalchemy as sa

from dataminer_dagster.db import migrate
from dataminer_dagster.db.engine import get_engine


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names(schema="dataminer"))
    finally:
        engine.dispose()


def _advisory_locks(url: str) -> list[tuple]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as c:
            return c.execute(
                sa.text(  # of this database: tests beside this one use the same server
                    """SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'
                          AND database = (SELECT oid FROM pg_database
                                           WHERE datname = current_database())"""
                )
            ).all()
    finally:
        engine.dispose()


def _race(url: str, threads: int) -> list[BaseException]:
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def migrate_now():
        barrier.wait()
        try:
            migrate.ensure_schema(get_engine(url))
        except BaseException as exc:  # noqa: BLE001 - every failure is the finding
            errors.append(exc)

    workers = [threading.Thread(target=migrate_now) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    return errors


def test_many_threads_migrate_a_fresh_database_once_and_leave_no_lock(empty_database_url):
    errors = _race(empty_database_url, threads=16)
    assert errors == []
    assert migrate.current_revision(get_engine(empty_database_url)) == migrate.head_revision()
    assert {"work_items", "projects", "videos", "run_heartbeats"} <= _tables(empty_database_url)
    assert _advisory_locks(empty_database_url) == []


def test_many_threads_on_a_migrated_database_do_nothing(database_url):
    migrate.forget(get_engine(database_url))
    assert _race(database_url, threads=16) == []
    assert _advisory_locks(database_url) == []


def _ensure_in_new_process(url: str) -> str:
    migrate.ensure_schema(get_engine(url))
    return migrate.current_revision(get_engine(url))


def test_several_processes_migrate_a_fresh_database_at_once(empty_database_url):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        revisions = pool.map(_ensure_in_new_process, [empty_database_url] * 4)
        pool.close()  # the workers end on their own: no terminate(), which signals them
        pool.join()
    assert revisions == [migrate.head_revision()] * 4
    assert _advisory_locks(empty_database_url) == []


_HOLD_LOCK = """
import sys, time
import sqlalchemy as sa
engine = sa.create_engine(sys.argv[1], poolclass=sa.NullPool)
with engine.begin() as c:
    c.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": int(sys.argv[2])})
    print("locked", flush=True)
    time.sleep(600)
"""


def _hold_migration_lock(url: str) -> subprocess.Popen:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, url, str(migrate.MIGRATION_LOCK_ID)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_process_killed_while_holding_the_migration_lock_blocks_nobody_after(
    empty_database_url,
):
    holder = _hold_migration_lock(empty_database_url)
    finished = threading.Event()
    errors: list[BaseException] = []

    def migrate_now():
        try:
            migrate.ensure_schema(get_engine(empty_database_url))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finished.set()

    try:
        threading.Thread(target=migrate_now, daemon=True).start()
        assert not finished.wait(2), "migrated while another process held the lock"
        holder.kill()  # SIGKILL: no unlock, no rollback from the client
        holder.wait()
        assert finished.wait(30), "the lock of a killed process was never released"
    finally:
        holder.kill()
    assert errors == []
    assert migrate.current_revision(get_engine(empty_database_url)) == migrate.head_revision()


def test_a_schema_at_head_is_checked_without_taking_the_lock(database_url):
    """The hot path (a run's setup, a sensor's tick, a CLI read) must not wait for a migration
    lock once the schema is at head, even when something holds that lock for ever."""
    holder = _hold_migration_lock(database_url)
    try:
        migrate.forget(get_engine(database_url))
        started = time.monotonic()
        done = threading.Event()
        threading.Thread(
            target=lambda: (migrate.ensure_schema(get_engine(database_url)), done.set()),
            daemon=True,
        ).start()
        assert done.wait(20), "ensure_schema waited for the migration lock"
        assert time.monotonic() - started < 20
    finally:
        holder.kill()
        holder.wait()


def test_the_head_read_from_the_scripts_is_alembics():
    from alembic.script import ScriptDirectory

    assert ScriptDirectory.from_config(migrate._alembic_config()).get_heads() == [
        migrate.head_revision()
    ]
