"""Dataset version numbers are allocated in the database (assets/dataset/store.py), under the
project's counter row lock: two builds of one project at once (a run whose lease was taken and the
run that took it, on one machine or two) never get the same number, whatever the versions folder
showed each of them; a number whose build's lease died before it published is given again, so a
retried build keeps its first attempt's number."""

from __future__ import annotations

import json
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.assets.dataset.dataset_files import VERSION_FILE
from dataminer_dagster.assets.dataset.store import allocate_version_number, version_published
from dataminer_dagster.db.leases import Lease, LeaseStore

S = "dataminer"
STAGE = "dataset"


def _project(engine: sa.Engine, output: Path) -> int:
    with engine.begin() as conn:
        return conn.execute(
            sa.text(f"""INSERT INTO {S}.projects (name, config, config_hash, output_dir)
                         VALUES ('birds', '{{}}', 'h', :out) RETURNING id"""),
            {"out": str(output)},
        ).scalar_one()


def _keep_versions(versions_dir: Path, numbers: list[int]) -> None:
    """Version folders as a build before the database counted them left them."""
    for number in numbers:
        folder = versions_dir / f"v{number}"
        folder.mkdir(parents=True)
        kept = {"version": number, "content_hash": f"h{number}", "images": 1, "created_at": "-"}
        (folder / VERSION_FILE).write_text(json.dumps(kept))


def _leases(engine: sa.Engine, project: int, count: int, owner: str = "run-a") -> list[Lease]:
    """`count` live leases (builds under way) of items of `project`."""
    store = LeaseStore(engine)
    keys = [f"build-{owner}-{i}" for i in range(count)]
    store.enqueue(STAGE, keys, project_ids=[project] * count)
    return store.claim_next(STAGE, owner, limit=count)


def _allocate(engine: sa.Engine, project: int, versions_dir: Path, token: uuid.UUID) -> int:
    with engine.begin() as conn:
        return allocate_version_number(conn, project, versions_dir, token)


def test_two_builds_allocating_at_once_get_distinct_numbers_above_the_kept_ones(
    database_url, tmp_path
):
    builds = [sa.create_engine(database_url, poolclass=sa.NullPool) for _ in range(2)]
    project = _project(builds[0], tmp_path)
    versions_dir = tmp_path / "dataset_versions"
    _keep_versions(versions_dir, [1, 2, 3])
    leases = [
        _leases(engine, project, 25, owner) for engine, owner in zip(builds, "ab", strict=True)
    ]
    start = threading.Barrier(2)

    def build(engine: sa.Engine, leases: list[Lease]) -> list[int]:
        start.wait()
        return [_allocate(engine, project, versions_dir, lease.token) for lease in leases]

    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(build, builds, leases)
    assert sorted(first + second) == list(range(4, 54)), (first, second)
    assert first == sorted(first) and second == sorted(second), "numbers only grow"


def test_a_build_waits_for_the_number_another_build_is_taking(database_url, tmp_path):
    """The second build reads the counter only once the first one's allocation committed: it
    gets the next number, not the one the versions folder (still without the first build's
    folder) suggests."""
    builds = [sa.create_engine(database_url, poolclass=sa.NullPool) for _ in range(2)]
    project = _project(builds[0], tmp_path)
    versions_dir = tmp_path / "dataset_versions"
    _keep_versions(versions_dir, [1])
    mine, theirs = _leases(builds[0], project, 2)
    with builds[0].connect() as first:
        transaction = first.begin()
        assert allocate_version_number(first, project, versions_dir, mine.token) == 2
        first_backend = first.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with ThreadPoolExecutor(1) as pool:
            second = pool.submit(_allocate, builds[1], project, versions_dir, theirs.token)
            _wait_until_blocked_by(builds[0], first_backend, second)
            assert not second.done(), f"took {second.result()} without waiting for the first"
            transaction.commit()
            assert second.result(timeout=60) == 3


def _wait_until_blocked_by(engine: sa.Engine, holder: int, waiter: Future) -> None:
    """Return once some backend waits for a lock that backend `holder` holds, or `waiter` is
    done (it did not wait)."""
    with engine.connect() as conn:
        while (
            not waiter.done()
            and not conn.execute(
                sa.text("""SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                       WHERE :holder = ANY (pg_blocking_pids(pid)))"""),
                {"holder": holder},
            ).scalar_one()
        ):
            conn.commit()  # a fresh snapshot of the activity for the next look
            time.sleep(0.02)


def test_a_build_retried_after_its_lease_died_gets_the_number_its_first_attempt_took(
    engine, tmp_path
):
    """A build that failed before publishing (a full disk: postponed) gave no version; its retry,
    under a new lease, is given the same number, so the project's first version is v1. A number
    held by a live build is not given to another."""
    project = _project(engine, tmp_path)
    versions_dir = tmp_path / "dataset_versions"
    store = LeaseStore(engine)
    [first, other] = _leases(engine, project, 2)
    assert _allocate(engine, project, versions_dir, first.token) == 1
    assert _allocate(engine, project, versions_dir, other.token) == 2, "v1's build is live"
    assert _allocate(engine, project, versions_dir, first.token) == 1, "asked again: the same"

    assert store.postpone(first, "no space left on device").applied
    store.enqueue(STAGE, [first.key], project_ids=[project], reset=["failed"])
    [retry] = store.claim_next(STAGE, "run-b")
    assert retry.key == first.key and retry.token != first.token
    assert _allocate(engine, project, versions_dir, retry.token) == 1


def test_a_published_number_is_never_given_again(engine, tmp_path):
    """Once a build's commit published its version (`version_published`), or its folder is there,
    its number stays its own after its lease is gone."""
    project = _project(engine, tmp_path)
    versions_dir = tmp_path / "dataset_versions"
    store = LeaseStore(engine)
    published, foldered = _leases(engine, project, 2)
    assert _allocate(engine, project, versions_dir, published.token) == 1
    assert _allocate(engine, project, versions_dir, foldered.token) == 2
    with store.completing(published) as conn:
        version_published(conn, project, [1])
    _keep_versions(versions_dir, [2])  # published on disk, its commit's answer lost
    assert store.postpone(foldered, "lost").applied

    [later] = _leases(engine, project, 1, owner="run-c")
    assert _allocate(engine, project, versions_dir, later.token) == 3
