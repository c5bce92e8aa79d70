"""The planner's view of Dagster's partition order: looked up by key in Dagster's storage, so that
a tick costs what it plans, not the size of the sets (issue 25: reading every key of the partition
sets on every tick cost 0.77 s of a 0.86 s tick at 100,000 videos), and nothing is kept between
ticks (the daemon replaces the code server that plans every minute).

Each test runs on a test instance (SQLite) and on the repository's dagster.yaml (PostgreSQL), and
checks the lookups against Dagster's own order (`get_dynamic_partitions`, which is what a run's
partition range is resolved with)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import dagster as dg
import pytest

from dataminer_dagster.engine.stored_partitions import PartitionOrder, partition_count
from dataminer_dagster.testing import instance_for_test
from tests.helpers.statements import statements_sent

NAME = "videos"


class NoWholeReads:
    """An instance whose whole-set read fails: the lookups must not need it."""

    def __init__(self, instance: dg.DagsterInstance):
        self.instance = instance

    def __getattr__(self, name):
        return getattr(self.instance, name)

    def get_dynamic_partitions(self, name):
        raise AssertionError("the planner must not read a whole partition set")


class ElsewhereKept(NoWholeReads):
    """An instance whose event log is not one of Dagster's SQL storages (as on Dagster+)."""

    event_log_storage = object()

    def get_dynamic_partitions(self, name):
        return self.instance.get_dynamic_partitions(name)


@pytest.fixture(params=["sqlite", "repository"])
def instance(request, dataminer_env, tmp_path):
    if request.param == "sqlite":
        with instance_for_test() as instance:
            yield instance
    else:
        with _repository_instance(tmp_path) as instance:
            yield instance


def ranked(positions: dict[str, int]) -> list[str]:
    return sorted(positions, key=positions.get)


def shuffled_set(instance) -> list[str]:
    """A set whose order is not its keys' order: added out of order, one key deleted and added
    again (Dagster puts it last), keys of another set in between."""
    instance.add_dynamic_partitions(NAME, ["m", "c", "x"])
    instance.add_dynamic_partitions("project_videos", ["p.m", "p.c"])
    instance.add_dynamic_partitions(NAME, ["a", "q"])
    instance.delete_dynamic_partition(NAME, "c")
    instance.add_dynamic_partitions(NAME, ["c", "b"])
    order = list(instance.get_dynamic_partitions(NAME))
    assert order == ["m", "x", "a", "q", "c", "b"]
    return order


@pytest.mark.parametrize("view", [NoWholeReads, ElsewhereKept])
def test_positions_rank_keys_in_dagsters_order(instance, view):
    order = shuffled_set(instance)
    positions = PartitionOrder(view(instance), NAME).positions(["b", "a", "nope", "m", "c"])
    assert ranked(positions) == [k for k in order if k in {"b", "a", "m", "c"}]
    assert PartitionOrder(view(instance), NAME).positions([]) == {}


@pytest.mark.parametrize("view", [NoWholeReads, ElsewhereKept])
def test_a_runs_range_covers_dagsters_keys_between_its_ends(instance, view):
    order = shuffled_set(instance)
    between = PartitionOrder(view(instance), NAME).between("x", "c")
    assert ranked(between) == order[order.index("x") : order.index("c") + 1]
    assert PartitionOrder(view(instance), NAME).between("x", "gone") == {}
    assert ranked(PartitionOrder(view(instance), NAME).between("a", "a")) == ["a"]


@pytest.mark.parametrize("view", [NoWholeReads, ElsewhereKept])
def test_keys_being_removed_this_cycle_are_not_in_the_order(instance, view):
    shuffled_set(instance)
    order = PartitionOrder(view(instance), NAME, removed={"a", "q"})
    assert ranked(order.positions(["m", "a", "q", "b"])) == ["m", "b"]
    assert ranked(order.between("x", "c")) == ["x", "c"]
    assert order.between("a", "c") == {}, "a range from a key being removed covers nothing"


def test_a_sets_count_is_dagsters(instance):
    shuffled_set(instance)
    assert partition_count(NoWholeReads(instance), NAME) == 6
    assert partition_count(ElsewhereKept(instance), NAME) == 6
    assert partition_count(instance, "project_videos") == 2
    assert partition_count(instance, "projects") == 0


def test_lookups_cost_the_keys_asked_about_not_the_set(repository_instance):
    """At 1,000,000 videos a tick asks for a few hundred keys: each statement reads the keys
    asked about (Dagster's unique index on set and key) or a run's range (the storage's (set,
    id) index), never the set."""
    import sqlalchemy as sa

    instance = repository_instance
    instance.add_dynamic_partitions(NAME, [f"v{i:05}" for i in range(20_000)])
    instance.add_dynamic_partitions("project_videos", [f"p.v{i:05}" for i in range(20_000)])
    engine = instance.event_log_storage._engine
    with engine.connect() as c:
        c.execute(sa.text("ANALYZE dynamic_partitions"))
    order = PartitionOrder(instance, NAME)
    asked = [f"v{i:05}" for i in range(5000, 5100)]
    sent = statements_sent(engine, lambda: order.positions(asked))
    sent += statements_sent(engine, lambda: order.between("v10000", "v10063"))
    assert len(sent) == 3
    for statement, parameters in sent:
        with engine.connect() as c:
            plan = c.exec_driver_sql(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
            ).scalar()[0]["Plan"]
        scans = [n for n in _nodes(plan) if "Relation Name" in n]
        read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
        assert read <= 100, (statement, scans)


@pytest.fixture
def repository_instance(dataminer_env, tmp_path):
    with _repository_instance(tmp_path) as instance:
        yield instance


@contextlib.contextmanager
def _repository_instance(tmp_path):
    """An instance on the repository's dagster.yaml (its PostgreSQL storages), on this test's
    database."""
    shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", tmp_path / "dagster.yaml")
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    yield instance
    instance.dispose()


def test_the_storages_read_of_new_keys_gives_dagsters_pages_and_cursors(repository_instance):
    from dagster_postgres import PostgresEventLogStorage

    storage = repository_instance.event_log_storage
    storage.add_dynamic_partitions(NAME, [f"v{i}" for i in range(7)])
    storage.add_dynamic_partitions("project_videos", [f"p.v{i}" for i in range(5)])
    storage.add_dynamic_partitions(NAME, ["late"])
    for ascending in (True, False):
        for limit in (1, 3, 8, 50):
            cursor, pages = None, 0
            while pages < 20:
                ours = storage.get_paginated_dynamic_partitions(NAME, limit, ascending, cursor)
                dagsters = PostgresEventLogStorage.get_paginated_dynamic_partitions(
                    storage, NAME, limit, ascending, cursor
                )
                assert (ours.results, ours.cursor, ours.has_more) == (
                    dagsters.results,
                    dagsters.cursor,
                    dagsters.has_more,
                )
                cursor, pages = ours.cursor, pages + 1
                if not ours.has_more:
                    break
    empty = storage.get_paginated_dynamic_partitions("projects", 10, True)
    assert (empty.results, empty.has_more) == ([], False)


def test_the_storages_membership_query_is_dagsters(repository_instance, monkeypatch):
    from dagster_postgres import PostgresEventLogStorage

    from dataminer_dagster.hosting import instance_storage

    monkeypatch.setattr(instance_storage, "_MEMBERSHIP_CHUNK", 3)  # several statements
    storage = repository_instance.event_log_storage
    storage.add_dynamic_partitions(NAME, [f"v{i}" for i in range(10)])
    storage.add_dynamic_partitions("project_videos", ["v1", "p.v2"])
    asked = ["v3", "nope", "v9", "v3", "p.v2", "v0", "", "v5", "also-not"]
    ours = storage.get_existing_dynamic_partitions(NAME, asked)
    assert ours == PostgresEventLogStorage.get_existing_dynamic_partitions(storage, NAME, asked)
    assert ours == {"v3", "v9", "v0", "v5"}
    assert storage.get_existing_dynamic_partitions(NAME, []) == set()


def test_the_storages_add_is_dagsters_in_one_statement_whatever_the_number_of_keys(
    repository_instance,
):
    """Keys added in the order given (Dagster's order), those already there or given twice
    skipped, the kept count right; sent as one statement whose text does not grow with the keys
    (Dagster's VALUES row per key was compiled anew on every call: most of a discovering tick)."""
    from dagster_postgres import PostgresEventLogStorage

    storage = repository_instance.event_log_storage
    calls = [
        (NAME, ["m", "c", "x"]),
        ("project_videos", ["p.m"]),
        (NAME, ["a", "c", "q", "a", "m", "b"]),
        (NAME, []),
    ]
    for name, keys in calls:
        storage.add_dynamic_partitions(name, keys)
    ours = {name: storage.get_dynamic_partitions(name) for name in (NAME, "project_videos")}
    assert ours == {NAME: ["m", "c", "x", "a", "q", "b"], "project_videos": ["p.m"]}
    assert partition_count(repository_instance, NAME) == 6

    storage.wipe()
    for name, keys in calls:
        PostgresEventLogStorage.add_dynamic_partitions(storage, name, keys)
    assert {name: storage.get_dynamic_partitions(name) for name in ours} == ours

    engine = storage._engine
    for keys in ([f"k{i}" for i in range(3)], [f"k{i}" for i in range(5_000)]):
        sent = statements_sent(engine, lambda keys=keys: storage.add_dynamic_partitions(NAME, keys))
        [(statement, parameters)] = [s for s in sent if "INSERT" in s[0]]
        assert len(statement) < 500 and list(parameters.values()).count(keys) == 1
    assert partition_count(repository_instance, NAME) == 6 + 5_000


def test_a_sets_new_keys_are_read_as_a_range_whatever_other_sets_hold_after_them(
    repository_instance,
):
    """After a bulk discovery the videos' cursor lies before every project video's key: Dagster's
    own read walked them all on every tick (105-165 ms at 1,000,000 videos); the storage's reads
    them as a range of its (set, id) index."""
    import sqlalchemy as sa

    storage = repository_instance.event_log_storage
    storage.add_dynamic_partitions(NAME, [f"v{i}" for i in range(5000)])
    storage.add_dynamic_partitions("project_videos", [f"p.v{i}" for i in range(5000)])
    engine = storage._engine
    with engine.connect() as c:
        c.execute(sa.text("ANALYZE dynamic_partitions"))
    cursor = storage.get_paginated_dynamic_partitions(NAME, 10_000, True).cursor
    read: list = []
    sent = statements_sent(
        engine,
        lambda: read.extend(
            storage.get_paginated_dynamic_partitions(NAME, 50_000, True, cursor).results
        ),
    )
    assert read == []
    [(statement, parameters)] = [s for s in sent if "dynamic_partitions" in s[0]]
    with engine.connect() as c:
        plan = c.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
        ).scalar()[0]["Plan"]
    scans = [n for n in _nodes(plan) if "Relation Name" in n]
    assert sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans) == 0, scans


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def test_the_storage_counts_keys_added_before_it_and_every_change_after(
    dataminer_env, tmp_path, monkeypatch
):
    """The counts are made where Dagster's table already holds keys (an instance that ran on
    Dagster's own storage, or an upgrade), exactly once however many processes build an instance
    at that moment; then every add, delete and wipe is counted."""
    import concurrent.futures

    import sqlalchemy as sa
    from dagster_postgres import PostgresEventLogStorage

    from dataminer_dagster.hosting import instance_storage

    with _repository_instance(tmp_path) as instance:
        engine = instance.event_log_storage._engine
        with engine.connect() as c:  # as before the counts existed
            c.execute(sa.text(f"DROP TABLE {instance_storage._PARTITION_COUNTS} CASCADE"))
            for function in ("add", "reset"):
                c.execute(
                    sa.text(
                        f"DROP FUNCTION {instance_storage._PARTITION_COUNTS}_{function} CASCADE"
                    )
                )
        PostgresEventLogStorage.add_dynamic_partitions(
            instance.event_log_storage, NAME, [f"v{i}" for i in range(50)]
        )
    monkeypatch.setattr(instance_storage, "_prepared_databases", set())

    def build(n):
        (home := tmp_path / f"process{n}").mkdir()
        with _repository_instance(home) as instance:
            return partition_count(instance, NAME)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(build, range(4))) == [50] * 4

    with _repository_instance(tmp_path) as instance:
        instance.add_dynamic_partitions(NAME, ["late", "v3"])
        instance.delete_dynamic_partition(NAME, "v7")
        instance.add_dynamic_partitions("project_videos", ["p.late"])
        assert partition_count(instance, NAME) == 50 == len(instance.get_dynamic_partitions(NAME))
        assert partition_count(instance, "project_videos") == 1
        instance.wipe()
        assert partition_count(instance, NAME) == partition_count(instance, "project_videos") == 0
        instance.add_dynamic_partitions(NAME, ["again"])
        with instance.event_log_storage.index_connection() as c:
            c.execute(sa.text("TRUNCATE dynamic_partitions"))
        assert partition_count(instance, NAME) == 0

    # Triggers gone (Dagster's table made anew), or the counts' table dropped by hand: the next
    # process to build an instance makes what is missing and counts again.
    for broken in (
        [
            f"DROP TRIGGER {instance_storage._PARTITION_COUNTS}_{e} ON dynamic_partitions"
            for e in ("insert", "delete")
        ],
        [f"DROP TABLE {instance_storage._PARTITION_COUNTS}"],
    ):
        with _repository_instance(tmp_path) as instance:
            with instance.event_log_storage.index_connection() as c:
                for statement in broken:
                    c.execute(sa.text(statement))
            instance.add_dynamic_partitions(NAME, [f"w{len(broken)}"])
        monkeypatch.setattr(instance_storage, "_prepared_databases", set())
        with _repository_instance(tmp_path) as instance:
            instance.add_dynamic_partitions(NAME, [f"x{len(broken)}"])
            assert partition_count(instance, NAME) == len(instance.get_dynamic_partitions(NAME))
