"""The sensors, each invoked with `build_sensor_context` against `instance_for_test()` and a real
claim database, asserting on the SensorResult / SkipReason they return and on the claim tables.

A sensor's partition requests are not applied by invoking it; tests that need the partitions add
them to the instance themselves, as the sensor daemon would.
"""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator, Sequence

import dagster as dg
import pytest
import sqlalchemy as sa
from dagster._core.events import DagsterEventType
from dagster._core.remote_origin import (
    RegisteredCodeLocationOrigin,
    RemoteJobOrigin,
    RemoteRepositoryOrigin,
)
from dagster._core.storage.dagster_run import DagsterRun

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.deletions import delete_orphan_videos, delete_project
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.partition_rows import row_count
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import DEAD, DONE, FAILED, PENDING, RUNNING
from dataminer_dagster.engine.discovery import (
    COMPARE_EVERY_S,
    FULL_COMPARE_EVERY_S,
    MAX_PARTITION_ADDS_PER_TICK,
    ROWS,
    DiscoveryCursor,
    plan_discovery,
)
from dataminer_dagster.engine.jobs import lane_jobs
from dataminer_dagster.engine.planning import REREQUEST_UNCOVERED_S
from dataminer_dagster.lanes import DEFAULT_LANES, LANES_BY_NAME, lane_of
from dataminer_dagster.registry import (
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
)
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.sensors.pipeline_sensors import build_sensors
from dataminer_dagster.settings import load_settings
from dataminer_dagster.tags import (
    AHEAD_TAG,
    BATCH_TAG,
    ITEMS_TAG,
    LANE_TAG,
    PRIORITY_TAG,
    PROJECT_NAMES_TAG,
    RANGE_END,
    RANGE_START,
    REQUESTED_BY_TAG,
    STAGES_TAG,
)
from dataminer_dagster.testing import instance_for_test
from tests.helpers.catalog_seed import catalog_keys
from tests.helpers.pipeline import make_silent, work_items
from tests.helpers.stages import STAGES

JOBS = lane_jobs(STAGES, DEFAULT_LANES)
SENSORS = {s.name: s for s in build_sensors(STAGES, JOBS, DEFAULT_LANES, load_settings())}
JOB_NAMES = {lane: job.name for lane, job in JOBS.items()}
# Leases that go stale in seconds, for tests of silent runs: no silence counts from before the
# database started, which for the test session's server may be moments ago.
SHORT_LEASES = {"heartbeat_s": 1, "stale_after_s": 5}


# --- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with instance_for_test() as instance:
        yield instance


@pytest.fixture
def db(database_url, tmp_path) -> DatabaseResource:
    return DatabaseResource(database_url=database_url, data_dir=str(tmp_path / "data"))


@pytest.fixture
def store(db) -> LeaseStore:
    return db.store


@pytest.fixture
def catalog(db) -> Catalog:
    return db.catalog


def tick(name: str, instance: dg.DagsterInstance, db: DatabaseResource, cursor: str | None = None):
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"db": db}) as context:
        return SENSORS[name](context)


def add_project(catalog: Catalog, name: str, video_ids: Sequence[str] = ()) -> ProjectRow:
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"urls": ["https://example.com/placeholder.mp4"]},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    project = catalog.projects.register(config).project
    link(catalog, project, video_ids)
    return project


def link(catalog: Catalog, project: ProjectRow, video_ids: Sequence[str]) -> None:
    """Link videos to a project as the catalog stage does, queueing what each needs next."""
    candidates = [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in video_ids]
    with catalog.engine.begin() as conn:
        catalog.videos.link(conn, project, candidates)
        catalog.advance_videos(conn, list(video_ids))


def apply_partition_requests(instance: dg.DagsterInstance, result: dg.SensorResult) -> None:
    """What the daemon does with the work sensor's partition requests (removals; the sensor
    adds new partitions itself)."""
    for request in result.dynamic_partitions_requests:
        if isinstance(request, dg.DeleteDynamicPartitionsRequest):
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
        else:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)


def add_partitions(instance: dg.DagsterInstance, db: DatabaseResource) -> None:
    """Every catalog row becomes a partition, as the work sensor's discovery does, without
    requesting any run."""
    plan_discovery(db.store.engine, DiscoveryCursor()).apply(instance)


def project_row(engine: sa.Engine, name: str) -> sa.Row:
    with engine.connect() as c:
        return c.execute(
            sa.text("SELECT * FROM dataminer.projects WHERE name = :n"), {"n": name}
        ).one()


def _add_run(
    instance: dg.DagsterInstance, lane: str, status: dg.DagsterRunStatus, tags: dict
) -> DagsterRun:
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("dataminer"), "__repository__")
    run = DagsterRun(
        job_name=JOB_NAMES[lane],
        run_id=str(uuid.uuid4()),
        status=status,
        tags={LANE_TAG: lane, **tags},
        remote_job_origin=RemoteJobOrigin(repository, JOB_NAMES[lane]),
    )
    return instance.add_run(run)


def add_run(
    instance: dg.DagsterInstance, stage: str, status: dg.DagsterRunStatus, **tags: str
) -> DagsterRun:
    """A run of a stage's lane job in the instance, as if the daemon had launched (or queued)
    it for that stage."""
    return _add_run(instance, lane_of(stage).name, status, {STAGES_TAG: stage, **tags})


def launch(instance: dg.DagsterInstance, result) -> list[DagsterRun]:
    """What the daemon does with a work tick's result: apply its partition requests and queue
    a run for each run request."""
    if not isinstance(result, dg.SensorResult):
        return []
    apply_partition_requests(instance, result)
    return [
        _add_run(instance, r.tags[LANE_TAG], dg.DagsterRunStatus.QUEUED, dict(r.tags))
        for r in result.run_requests
    ]


def run_requests(result) -> list[dg.RunRequest]:
    return list(result.run_requests) if isinstance(result, dg.SensorResult) else []


PARTITION_SETS = ("projects", "videos", "project_videos")


def partitions(instance: dg.DagsterInstance) -> dict[str, list[str]]:
    return {name: instance.get_dynamic_partitions(name) for name in PARTITION_SETS}


def added_since(instance: dg.DagsterInstance, before: dict[str, list[str]]) -> dict[str, list]:
    """The partitions added since `before` (the work sensor adds them itself, in bulk)."""
    now = partitions(instance)
    return {name: now[name][len(before[name]) :] for name in now if now[name] != before[name]}


def requests_by_lane(result) -> dict[str, list[dg.RunRequest]]:
    assert isinstance(result, dg.SensorResult), result
    grouped: dict[str, list[dg.RunRequest]] = {}
    for request in result.run_requests:
        grouped.setdefault(request.tags[LANE_TAG], []).append(request)
    return grouped


def ready_requests(result, lane: str) -> list[dg.RunRequest]:
    return [r for r in requests_by_lane(result).get(lane, []) if AHEAD_TAG not in r.tags]


def ahead_requests(result, lane: str) -> list[dg.RunRequest]:
    return [r for r in requests_by_lane(result).get(lane, []) if AHEAD_TAG in r.tags]


def covered(request: dg.RunRequest, order: Sequence[str]) -> list[str]:
    start, end = order.index(request.tags[RANGE_START]), order.index(request.tags[RANGE_END])
    return list(order[start : end + 1])


def batch_ids(request: dg.RunRequest) -> tuple[int, int]:
    first, last = request.tags[BATCH_TAG].split("-")
    return int(first), int(last)


def keys_for(partitions: str, n: int) -> list[str]:
    if partitions == "videos":
        return [f"v{i:05d}" for i in range(n)]
    if partitions == "projects":
        return [f"p{i:05d}" for i in range(n)]
    return [f"p.v{i:05d}" for i in range(n)]


# --- discovery -----------------------------------------------------------------------------------


def test_discovery_adds_new_rows_in_discovery_order_and_moves_its_cursor(instance, db, catalog):
    skipped = tick("work", instance, db)
    assert isinstance(skipped, dg.SkipReason)
    assert skipped.skip_message == "nothing new, no project can move, no work to request"

    alpha = add_project(catalog, "alpha", ["v2", "v0", "v1"])
    add_project(catalog, "beta", ["v0", "v3"])
    before = partitions(instance)
    result = tick("work", instance, db)

    assert isinstance(result, dg.SensorResult)
    added = added_since(instance, before)  # by the tick itself, in bulk: no request to apply
    assert not result.dynamic_partitions_requests
    assert list(added) == ["projects", "videos", "project_videos"]
    assert added["projects"] == ["alpha", "beta"]
    assert added["videos"] == ["v2", "v0", "v1", "v3"], "videos come in the order they were found"
    assert added["project_videos"] == ["alpha.v2", "alpha.v0", "alpha.v1", "beta.v0", "beta.v3"]
    cursor = json.loads(result.cursor)
    ids = {k: cursor[k] for k in ("project", "video", "project_video")}
    comparison = {"compared_at", "full_compared_at", "comparing", "full_pass", "unexplained"}
    assert set(cursor) == {*ids, *comparison, "configs"}
    assert all(ids.values())
    # The projects' config versions, observed for Dagster's stale partitions: each project-level
    # stage's fingerprint as the data version of its config asset's partition.
    assert sorted(cursor["configs"]) == ["alpha", "beta"]
    observed = {
        (e.asset_key.to_user_string(), e.partition): e.tags["dagster/data_version"]
        for e in result.asset_events
        if e.asset_key.to_user_string().endswith("_config")
    }
    assert sorted(observed) == [
        (f"{asset}_config", project)
        for asset in ("dataset", "deduped_set", "detections", "video_catalog")
        for project in ("alpha", "beta")
    ]

    # Nothing new: the cursor keeps the sensor from adding anything twice, and the runs it
    # requested, once queued, keep it from requesting them again.
    launch(instance, result)
    assert isinstance(tick("work", instance, db, result.cursor), dg.SkipReason)

    link(catalog, alpha, ["v4", "v3"])
    before = partitions(instance)
    again = tick("work", instance, db, result.cursor)
    added = added_since(instance, before)
    assert added == {"videos": ["v4"], "project_videos": ["alpha.v4", "alpha.v3"]}
    assert json.loads(again.cursor)["project"] == cursor["project"]


def test_discovery_adds_at_most_25000_partitions_per_tick(instance, db, catalog, engine):
    alpha = add_project(catalog, "alpha")
    total_videos = MAX_PARTITION_ADDS_PER_TICK + 10
    with engine.begin() as c:
        c.execute(
            sa.text("""INSERT INTO dataminer.videos (video_id, url)
                       SELECT 'g' || lpad(i::text, 6, '0'), 'https://example.com/' || i
                         FROM generate_series(1, :n) AS i"""),
            {"n": total_videos},
        )
    link(catalog, alpha, ["g000001", "g000002"])

    seen: dict[str, list[str]] = {"projects": [], "videos": [], "project_videos": []}
    cursor, ticks = None, 0
    while True:
        before = partitions(instance)
        result = tick("work", instance, db, cursor)
        added = added_since(instance, before)
        if not added:
            break
        ticks += 1
        assert sum(len(keys) for keys in added.values()) <= MAX_PARTITION_ADDS_PER_TICK
        for name, keys in added.items():
            seen[name] += keys
        cursor = result.cursor
    assert ticks == 2
    assert seen["projects"] == ["alpha"]
    assert len(seen["videos"]) == len(set(seen["videos"])) == total_videos
    assert seen["videos"] == sorted(seen["videos"]), "in discovery order, none skipped"
    assert seen["project_videos"] == ["alpha.g000001", "alpha.g000002"]
    assert len(instance.get_dynamic_partitions("videos")) == total_videos


def test_plan_discovery_chunks_by_budget_without_skipping_or_repeating(engine, catalog):
    add_project(catalog, "alpha", ["a", "b", "c"])
    add_project(catalog, "beta", ["c", "d"])
    chunks, cursor = [], DiscoveryCursor()
    while (found := plan_discovery(engine, cursor, budget=2)).count:
        assert found.count <= 2
        chunks.append(found.additions)
        cursor = found.cursor
    assert chunks == [
        {"projects": ["alpha", "beta"]},
        {"videos": ["a", "b"]},
        {"videos": ["c", "d"]},
        {"project_videos": ["alpha.a", "alpha.b"]},
        {"project_videos": ["alpha.c", "beta.c"]},
        {"project_videos": ["beta.d"]},
    ]
    assert DiscoveryCursor.parse(cursor.dump()) == cursor


def test_discovery_removes_the_partitions_of_deleted_rows_once_caught_up(instance, db, catalog):
    add_project(catalog, "alpha", ["v0", "v1"])
    add_project(catalog, "beta", ["v1", "v2"])
    first = tick("work", instance, db)
    launch(instance, first)

    delete_project(db.store.engine, db.paths, "beta")  # v2 stays, an orphan
    link(catalog, add_project(catalog, "gamma"), ["v3"])
    before = partitions(instance)
    second = tick("work", instance, db, first.cursor)
    assert added_since(instance, before)  # gamma's
    assert not second.dynamic_partitions_requests, (
        "new rows first: nothing is removed while partitions are still being added"
    )
    launch(instance, second)

    third = tick("work", instance, db, second.cursor)
    removed = {
        r.partitions_def_name: list(r.partition_keys)
        for r in third.dynamic_partitions_requests
        if isinstance(r, dg.DeleteDynamicPartitionsRequest)
    }
    assert removed == {"projects": ["beta"], "project_videos": ["beta.v1", "beta.v2"]}
    launch(instance, third)
    assert instance.get_dynamic_partitions("projects") == ["alpha", "gamma"]
    assert instance.get_dynamic_partitions("videos") == ["v0", "v1", "v2", "v3"]

    delete_orphan_videos(db.store.engine, db.paths)
    assert isinstance(tick("work", instance, db, third.cursor), dg.SkipReason), (
        "the keys were compared less than COMPARE_EVERY_S ago"
    )
    launch(instance, tick("work", instance, db, later(third.cursor)))
    assert instance.get_dynamic_partitions("videos") == ["v0", "v1", "v3"]
    assert isinstance(tick("work", instance, db, later(third.cursor)), dg.SkipReason)


def test_rows_committed_out_of_id_order_still_become_partitions(instance, db, catalog):
    """Two transactions linking videos: the one holding the lower ids commits last, after a tick
    whose cursor passed its ids. The next tick that finds nothing new adds them."""
    project = add_project(catalog, "alpha")
    first = tick("work", instance, db)
    launch(instance, first)
    early = [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in ("v0", "v1")]
    with catalog.engine.begin() as slow:
        catalog.videos.link(slow, project, early)  # takes the lower ids, commits last
        link(catalog, project, ["v2"])
        second = tick("work", instance, db, first.cursor)
        launch(instance, second)
    assert instance.get_dynamic_partitions("videos") == ["v2"]

    before = partitions(instance)
    third = tick("work", instance, db, second.cursor)
    added = added_since(instance, before)
    assert added == {"videos": ["v0", "v1"], "project_videos": ["alpha.v0", "alpha.v1"]}
    launch(instance, third)
    assert sorted(instance.get_dynamic_partitions("project_videos")) == [
        "alpha.v0",
        "alpha.v1",
        "alpha.v2",
    ]
    after, before = DiscoveryCursor.parse(third.cursor), DiscoveryCursor.parse(second.cursor)
    assert (after.project, after.video, after.project_video) == (
        before.project,
        before.video,
        before.project_video,
    ), "the cursor does not go back"


def test_counts_that_agree_skip_the_key_by_key_comparison_until_it_is_due(instance, db, catalog):
    """A row the cursor passed and a partition whose row is gone leave the counts equal: the
    cheap comparison (counts) sees nothing, the key-by-key pass (every FULL_COMPARE_EVERY_S)
    finds both."""
    project = add_project(catalog, "alpha", ["v0"])
    launch(instance, tick("work", instance, db))
    instance.add_dynamic_partitions("videos", ["ghost"])
    instance.add_dynamic_partitions("project_videos", ["alpha.ghost"])
    link(catalog, project, ["v1"])
    passed = DiscoveryCursor(project=10**9, video=10**9, project_video=10**9)
    passed.full_compared_at = time.time()  # compared key by key a moment ago; counts due
    cheap = plan_discovery(db.store.engine, passed, instance=instance)
    assert cheap.additions == cheap.removals == {}
    assert cheap.cursor.compared_at > 0 and cheap.cursor.full_compared_at == passed.full_compared_at

    passed.full_compared_at -= FULL_COMPARE_EVERY_S
    full = plan_discovery(db.store.engine, passed, instance=instance)
    with db.store.engine.connect() as c:  # the counts count what discovery compares
        assert all(row_count(c, n) == len(catalog_keys(c, n)) for n in PARTITION_SETS)
    assert full.additions == {"videos": ["v1"], "project_videos": ["alpha.v1"]}
    assert full.removals == {"videos": ["ghost"], "project_videos": ["alpha.ghost"]}

    # A count that differs needs no wait: one more row is found at the next comparison.
    link(catalog, project, ["v2"])
    full.apply(instance)
    found = plan_discovery(
        db.store.engine,
        DiscoveryCursor(**{**passed.__dict__, "full_compared_at": time.time()}),
        instance=instance,
    )
    assert found.additions == {"videos": ["v2"], "project_videos": ["alpha.v2"]}


def test_the_key_by_key_pass_goes_in_steps_kept_in_the_cursor(instance, db, catalog, monkeypatch):
    """The pass over every key reads a step's keys a tick, its progress in the cursor
    alone (the daemon's code server, which evaluates the sensor, is replaced every minute): rows
    the cursor passed and partitions whose row is gone, which leave the counts equal here, are
    found in every set, a step at a time, and rows that the cursor finds meanwhile come first."""
    one_chunk_a_step(monkeypatch, keys=3)
    project = add_project(catalog, "alpha", [f"v{i}" for i in range(5)])
    launch(instance, tick("work", instance, db))
    instance.add_dynamic_partitions("videos", ["ghost"])
    instance.add_dynamic_partitions("project_videos", ["alpha.ghost", "no-separator"])
    link(catalog, project, ["v5"])  # rows the cursor passed:
    link(catalog, add_project(catalog, "beta"), ["v5"])
    instance.add_dynamic_partitions("projects", ["beta"])
    passed = DiscoveryCursor(project=10**9, video=10**9, project_video=10**9)

    raw, steps, added, removed = passed.dump(), 0, {}, {}
    while True:
        found = plan_discovery(db.store.engine, DiscoveryCursor.parse(raw), instance=instance)
        steps += 1
        for name, keys in found.additions.items():
            added.setdefault(name, []).extend(keys)
        for name, keys in found.removals.items():
            removed.setdefault(name, []).extend(keys)
        found.apply(instance)
        raw = found.cursor.dump()
        if found.cursor.full_pass is None:
            break
        assert found.cursor.full_compared_at == 0, "a pass under way is not a pass made"
        if steps == 4:  # a new row, which the cursor finds: the pass waits a tick
            cursor = DiscoveryCursor.parse(raw)
            with db.store.engine.connect() as c:
                cursor.video, cursor.project_video = (
                    c.execute(sa.text(f"SELECT max(id) FROM dataminer.{table}")).scalar()
                    for table in ("videos", "project_videos")
                )
            link(catalog, project, ["v6"])
            new = plan_discovery(db.store.engine, cursor, instance=instance)
            assert new.additions == {"videos": ["v6"], "project_videos": ["alpha.v6"]}
            assert new.removals == {} and new.cursor.full_pass == cursor.full_pass
            new.apply(instance)
            raw = new.cursor.dump()
    assert found.cursor.full_compared_at > 0
    # rows and partitions of each set (2 + 2, 7 + 7, 8 + 9 with the new row), 3 keys a step
    assert steps >= (2 + 2 + 7 + 7 + 8 + 9) // 3
    assert added == {"videos": ["v5"], "project_videos": ["alpha.v5", "beta.v5"]}
    assert removed == {"videos": ["ghost"], "project_videos": ["alpha.ghost", "no-separator"]}
    with db.store.engine.connect() as c:
        for name in ("projects", "videos", "project_videos"):
            assert sorted(instance.get_dynamic_partitions(name)) == sorted(catalog_keys(c, name))
    assert plan_discovery(db.store.engine, DiscoveryCursor.parse(raw), instance=instance).count == 0


def test_counts_that_differ_set_off_a_comparison_of_that_side_newest_first(
    instance, db, catalog, monkeypatch
):
    """A row the cursor passed is among the newest: the comparison reads the side whose count is
    larger (the catalog's videos and project videos here), newest first, a step a tick, and ends
    as soon as the counts agree, long before it has read the whole set."""
    one_chunk_a_step(monkeypatch, keys=3)
    project = add_project(catalog, "alpha", [f"v{i:02}" for i in range(30)])
    launch(instance, tick("work", instance, db))
    early = [Candidate("late", "url", url="https://example.com/late.mp4")]
    with catalog.engine.begin() as slow:
        catalog.videos.link(slow, project, early)  # ids below the next ones, committed last
        link(catalog, project, ["v30"])
        cursor = DiscoveryCursor.parse(tick("work", instance, db).cursor)
    cursor.full_compared_at = time.time()  # the pass over every key is not due
    cursor.compared_at = 0.0

    found = plan_discovery(db.store.engine, cursor, instance=instance)
    assert found.cursor.comparing["sides"][0] == ["videos", ROWS]
    assert found.cursor.full_pass is None
    steps = 1
    while found.cursor.comparing is not None:
        found.apply(instance)
        found = plan_discovery(db.store.engine, found.cursor, instance=instance)
        steps += 1
        assert found.removals == {}
    assert instance.has_dynamic_partition("videos", "late")
    assert instance.has_dynamic_partition("project_videos", "alpha.late")
    assert steps <= 4, "ends when the counts agree, not after 60 keys"
    assert found.cursor.full_compared_at == cursor.full_compared_at


def test_a_comparison_set_off_by_counts_goes_before_the_pass_over_every_key(
    instance, db, catalog, monkeypatch
):
    """A row the cursor passed, while the hourly pass is under way: the counts, compared every
    COMPARE_EVERY_S as always, set off a comparison of that side, which finds it before the
    pass goes on from where it was."""
    one_chunk_a_step(monkeypatch, keys=3)
    project = add_project(catalog, "alpha", [f"v{i:02}" for i in range(20)])
    launch(instance, tick("work", instance, db))
    cursor = DiscoveryCursor.parse(tick("work", instance, db).cursor)  # counts compared
    cursor.full_compared_at = 0.0
    for _ in range(3):
        cursor = plan_discovery(db.store.engine, cursor, instance=instance).cursor
    paused = cursor.full_pass
    assert paused is not None and cursor.comparing is None

    link(catalog, project, ["late"])
    cursor.video, cursor.project_video = cursor.video + 1, cursor.project_video + 1  # passed
    cursor.compared_at = 0.0
    found = plan_discovery(db.store.engine, cursor, instance=instance)
    assert found.additions == {"videos": ["late"]}, "the newest videos first"
    while found.cursor.comparing is not None:
        assert found.cursor.full_pass == paused
        found.apply(instance)
        found = plan_discovery(db.store.engine, found.cursor, instance=instance)
    assert instance.has_dynamic_partition("project_videos", "alpha.late")
    assert found.cursor.full_pass != paused, "once the counts agree, the pass goes on"


def test_a_count_that_drifted_sets_off_one_comparison_not_one_a_tick(instance, db, catalog):
    """A count that no key explains (a delta written by hand here): the comparison it sets off
    reads its side to the end once; the same difference then sets off nothing, and a new one
    (a row the cursor passed) does."""
    project = add_project(catalog, "alpha", ["v0", "v1"])
    launch(instance, tick("work", instance, db))
    cursor = DiscoveryCursor.parse(tick("work", instance, db).cursor)
    with db.store.engine.begin() as c:
        c.execute(
            sa.text("INSERT INTO dataminer.row_counts (table_name, delta) VALUES ('videos', 1)")
        )
    cursor.compared_at = 0.0
    found = plan_discovery(db.store.engine, cursor, instance=instance)
    assert found.additions == found.removals == {}
    assert found.cursor.comparing is None and found.cursor.unexplained == {"videos": 1}
    found.cursor.compared_at = 0.0
    again = plan_discovery(db.store.engine, found.cursor, instance=instance)
    assert again.cursor.comparing is None and again.cursor.compared_at > 0

    link(catalog, project, ["late"])
    again.cursor.video, again.cursor.project_video = 10**9, 10**9  # passed
    again.cursor.compared_at = 0.0
    late = plan_discovery(db.store.engine, again.cursor, instance=instance)
    assert late.additions == {"videos": ["late"], "project_videos": ["alpha.late"]}


def one_chunk_a_step(monkeypatch, keys: int) -> None:
    """Comparisons that read one chunk of `keys` keys a tick, so that a test sees their steps."""
    monkeypatch.setattr("dataminer_dagster.engine.discovery.COMPARE_CHUNK_KEYS", keys)
    monkeypatch.setattr("dataminer_dagster.engine.discovery.COMPARE_STEP_S", 0.0)


def later(cursor: str) -> str:
    """The cursor as a tick COMPARE_EVERY_S later finds it: due to compare the keys again."""
    parsed = DiscoveryCursor.parse(cursor)
    parsed.compared_at -= COMPARE_EVERY_S
    return parsed.dump()


# --- work ----------------------------------------------------------------------------------------


def test_a_new_project_gets_its_partitions_and_its_runs_in_one_tick(instance, db, catalog, engine):
    add_project(catalog, "alpha", ["v0", "v1", "v2"])
    before = partitions(instance)
    result = tick("work", instance, db)
    assert set(added_since(instance, before)) == {"projects", "videos", "project_videos"}
    [catalog_run] = ready_requests(result, "catalog")
    assert catalog_run.job_name == "catalog_job"
    assert (catalog_run.tags[RANGE_START], catalog_run.tags[RANGE_END]) == ("alpha", "alpha")
    [video_run] = ready_requests(result, "video")
    assert video_run.job_name == "video_job"
    assert (video_run.tags[RANGE_START], video_run.tags[RANGE_END]) == ("v0", "v2")
    assert video_run.tags[REQUESTED_BY_TAG] == "sensor"
    assert video_run.tags[STAGES_TAG] == "download,frames"
    assert video_run.tags[ITEMS_TAG] == "3"
    downloads = work_items(engine, DOWNLOAD)
    assert batch_ids(video_run) == (downloads["v0"].id, downloads["v2"].id)
    assert all(r.requested_at is not None for r in downloads.values())


def test_items_whose_requested_run_never_came_are_requested_again_within_a_minute(
    instance, db, catalog, engine
):
    """The tick noted its requests, then its result was lost (the daemon killed before it
    created the runs): no live run covers the items, so they do not wait REREQUEST_AFTER_S."""
    add_project(catalog, "alpha", ["v0", "v1"])
    apply_partition_requests(instance, tick("work", instance, db))  # no run is created
    assert not ready_requests(tick("work", instance, db), "video"), "not at once"

    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE dataminer.work_items SET requested_at = now() - make_interval(secs => :s)"
            ),
            {"s": REREQUEST_UNCOVERED_S + 1},
        )
    result = tick("work", instance, db)
    [again] = ready_requests(result, "video")
    assert (again.tags[RANGE_START], again.tags[RANGE_END]) == ("v0", "v1")
    launch(instance, result)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE dataminer.work_items SET requested_at = now() - make_interval(secs => :s)"
            ),
            {"s": REREQUEST_UNCOVERED_S + 1},
        )
    assert not ready_requests(tick("work", instance, db), "video"), "a live run covers them"


def test_work_requests_only_items_whose_partitions_exist_or_are_being_added(
    instance, db, store, engine
):
    store.enqueue(DOWNLOAD, ["stray"])  # a work item without a catalog row: never a partition
    assert isinstance(tick("work", instance, db), dg.SkipReason)
    assert work_items(engine, DOWNLOAD)["stray"].requested_at is None, (
        "an item that could not be requested is not marked as requested"
    )


def test_a_video_linked_later_gets_its_partition_and_run_in_the_same_tick(
    instance, db, catalog, engine
):
    alpha = add_project(catalog, "alpha", ["v0"])
    first = tick("work", instance, db)
    launch(instance, first)
    link(catalog, alpha, ["v1"])
    before = partitions(instance)
    result = tick("work", instance, db, first.cursor)
    assert added_since(instance, before) == {"videos": ["v1"], "project_videos": ["alpha.v1"]}
    [run] = ready_requests(result, "video")
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("v1", "v1")


def _lane_params():
    return [pytest.param(lane, id=lane.name) for lane in DEFAULT_LANES]


def catalog_rows(catalog: Catalog, store: LeaseStore, lane, n: int) -> list[str]:
    """`n` partitions of the lane's set, backed by catalog rows, each with a pending item of the
    lane's first stage."""
    if lane.partitions == "projects":
        keys = keys_for("projects", n)
        for key in keys:
            add_project(catalog, key)
    else:
        videos = keys_for("videos", n)
        add_project(catalog, "p", videos)
        keys = videos if lane.partitions == "videos" else [f"p.{v}" for v in videos]
    store.enqueue(lane.stages[0], keys)
    return keys


@pytest.mark.parametrize("lane", _lane_params())
def test_work_batches_each_lane_by_its_policy(lane, instance, db, catalog, store, engine):
    policy = lane.policy
    stage = lane.stages[0]
    keys = catalog_rows(catalog, store, lane, policy.batch * policy.max_runs + 3)
    ids = {k: r.id for k, r in work_items(engine, stage).items()}

    runs = ready_requests(tick("work", instance, db), lane.name)
    assert len(runs) == policy.max_runs
    expected = [
        keys[i : i + policy.batch] for i in range(0, policy.batch * policy.max_runs, policy.batch)
    ]
    for run, chunk in zip(runs, expected, strict=True):
        assert run.job_name == JOB_NAMES[lane.name] == lane.job_name
        assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (chunk[0], chunk[-1])
        assert batch_ids(run) == (ids[chunk[0]], ids[chunk[-1]])
        assert run.tags[STAGES_TAG] == ",".join(lane.stages)
        assert run.tags[REQUESTED_BY_TAG] == "sensor" and AHEAD_TAG not in run.tags
        # The project a person sees on the run: the videos' project, or the project itself.
        names = ", ".join(sorted({k if lane.partitions == "projects" else "p" for k in chunk}))
        assert run.tags[PROJECT_NAMES_TAG] == names

    # Requested items are not asked for again; the three left over are, on the following ticks.
    later: list[str] = []
    for _ in range(5):
        if not (runs := ready_requests(tick("work", instance, db), lane.name)):
            break
        assert len(runs) <= policy.max_runs
        for run in runs:
            later += covered(run, keys)
    assert later == keys[-3:]


def test_items_live_runs_cover_never_crowd_out_the_work_left_over(
    instance, db, catalog, store, engine
):
    """A minute after they were requested, the covered items are due again by age, first in due
    order; they must not fill the query's limit of the one free slot and starve the lane."""
    lane = LANES_BY_NAME["video"]
    policy = lane.policy
    keys = catalog_rows(catalog, store, lane, policy.batch * (policy.max_runs + 1))
    result = tick("work", instance, db)
    apply_partition_requests(instance, result)
    requested = ready_requests(result, "video")
    assert len(requested) == policy.max_runs
    for request in requested[:-1]:  # the last run never came to be
        _add_run(instance, "video", dg.DagsterRunStatus.QUEUED, dict(request.tags))
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE dataminer.work_items SET requested_at = now() - make_interval(secs => :s)"
            ),
            {"s": REREQUEST_UNCOVERED_S + 1},
        )
    [again] = ready_requests(tick("work", instance, db), "video")
    lost = keys[policy.batch * (policy.max_runs - 1) : policy.batch * policy.max_runs]
    assert (again.tags[RANGE_START], again.tags[RANGE_END]) == (lost[0], lost[-1])


def test_a_run_starts_at_the_first_stage_of_its_lane_that_has_work(
    instance, db, catalog, store, engine
):
    add_project(catalog, "p", ["v0"])
    store.mark(DOWNLOAD, "v0", DONE, "downloaded in a test")
    store.enqueue(FRAMES, ["v0"])  # e.g. a new project wants another extraction profile
    [run] = ready_requests(tick("work", instance, db), "video")
    assert run.tags[STAGES_TAG] == "frames"
    assert run.asset_selection == [dg.AssetKey("frames")]


def test_work_ranges_follow_the_partition_order(instance, db, catalog, store):
    keys = keys_for("videos", 5)
    add_project(catalog, "p", keys)
    instance.add_dynamic_partitions("videos", list(reversed(keys)))
    [run] = ready_requests(tick("work", instance, db), "video")
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (keys[-1], keys[0])


def test_work_requests_no_more_runs_than_a_lane_may_have_in_flight(instance, db, catalog, store):
    keys = keys_for("videos", 100)
    add_project(catalog, "p", keys)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.QUEUED)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.STARTED)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.SUCCESS)  # finished: does not count
    add_run(instance, FILTER, dg.DagsterRunStatus.QUEUED)  # another lane's share

    [run] = ready_requests(tick("work", instance, db), "video")
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (keys[0], keys[24])

    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.NOT_STARTED)
    assert ready_requests(tick("work", instance, db), "video") == [], (
        "three video runs are in flight already"
    )


def test_a_dead_run_does_not_count_as_in_flight(
    instance, db, catalog, store, monkeypatch, tmp_path
):
    """A run worker killed under the default launcher leaves its run STARTED for ever; its
    stale heartbeat must not use up its lane's share (issue 10: filter stuck at 0/6)."""
    db = with_settings(db, monkeypatch, tmp_path, leases=SHORT_LEASES)
    keys = catalog_rows(catalog, store, LANES_BY_NAME["filter"], 3)
    add_partitions(instance, db)
    store.mark(CATALOG, "p", DONE, "catalog done in a test")
    for v in keys_for("videos", 3):
        store.mark(DOWNLOAD, v, DONE, "downloaded in a test")
    zombie = add_run(instance, FILTER, dg.DagsterRunStatus.STARTED)
    store.liveness.heartbeat(zombie.run_id, "gone-host", 4242)
    assert ready_requests(tick("work", instance, db), "filter") == [], "the lane's one run"

    make_silent(store.engine, [zombie.run_id], longer_than_s=SHORT_LEASES["stale_after_s"])
    [run] = ready_requests(tick("work", instance, db), "filter")
    assert covered(run, keys) == keys


def test_partitions_a_live_run_covers_are_not_requested_again(instance, db, catalog, store):
    keys = keys_for("videos", 6)
    add_project(catalog, "p", keys)
    add_partitions(instance, db)
    add_run(
        instance,
        DOWNLOAD,
        dg.DagsterRunStatus.STARTED,
        **{RANGE_START: keys[0], RANGE_END: keys[3]},
    )
    [run] = ready_requests(tick("work", instance, db), "video")
    assert covered(run, keys) == keys[4:]


def test_work_waits_for_the_retry_back_off(instance, db, catalog, store, engine):
    add_project(catalog, "p", ["v0", "v1"])
    [lease] = store.claim_keys(DOWNLOAD, ["v0"], "some-run")[0]
    store.fail(lease, "connection reset")  # a failure whose back-off has not elapsed
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET next_attempt_at = now() + interval '1 hour'
                        WHERE item_key = 'v0'""")
        )
    [run] = ready_requests(tick("work", instance, db), "video")
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("v1", "v1")
    assert work_items(engine, DOWNLOAD)["v0"].status == FAILED


# --- runs requested ahead ------------------------------------------------------------------------


def test_the_filter_lane_is_requested_ahead_of_videos_in_flight(instance, db, catalog, engine):
    add_project(catalog, "alpha", ["v0", "v1"])
    result = tick("work", instance, db)
    [video] = ready_requests(result, "video")
    [ahead] = ahead_requests(result, "filter")
    assert (ahead.tags[RANGE_START], ahead.tags[RANGE_END]) == ("alpha.v0", "alpha.v1")
    assert ahead.tags[PRIORITY_TAG] == "-1", "behind the runs whose output it waits for"
    assert BATCH_TAG not in ahead.tags and ahead.tags[ITEMS_TAG] == "2"
    assert ahead.tags[STAGES_TAG] == FILTER
    assert "filter" not in work_items(engine, FILTER), "requesting ahead creates no item"

    # Once the daemon has queued it, the next tick asks for nothing more.
    launch(instance, result)
    assert isinstance(tick("work", instance, db, result.cursor), dg.SkipReason)


@pytest.mark.parametrize("executor", ["multiprocess", "celery"])
def test_no_lane_is_requested_ahead_where_steps_set_up_their_own_resources(
    executor, instance, db, catalog, monkeypatch
):
    """There a run waiting for its input would hold the `gpu` slot that the work it waits for
    needs: its step's process, which waits, starts only with the slot."""
    monkeypatch.setenv("DATAMINER_EXECUTOR", executor)
    sensors = {s.name: s for s in build_sensors(STAGES, JOBS, DEFAULT_LANES, load_settings())}
    add_project(catalog, "alpha", ["v0", "v1"])
    with dg.build_sensor_context(instance=instance, resources={"db": db}) as context:
        result = sensors["work"](context)
    assert ready_requests(result, "video")
    assert ahead_requests(result, "filter") == []


def test_nothing_is_requested_ahead_of_work_that_waits(instance, db, catalog, store, engine):
    add_project(catalog, "alpha", ["v0"])
    add_partitions(instance, db)
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    [lease], _ = store.claim_keys(DOWNLOAD, ["v0"], "video-run")
    store.fail(lease, "HTTP 429")  # waits for its retry: nothing is in flight
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE dataminer.work_items SET next_attempt_at = now() + interval '1 hour'")
        )
    assert run_requests(tick("work", instance, db)) == []


def test_a_project_is_requested_ahead_once_all_its_unfinished_members_are_in_flight(
    instance, db, catalog, store, engine
):
    add_project(catalog, "alpha", ["v0", "v1"])
    add_partitions(instance, db)
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    for v in ("v0", "v1"):
        store.mark(DOWNLOAD, v, DONE, "downloaded in a test")
        store.mark(FRAMES, v, DONE, "extracted in a test")
    finish_members(store, "alpha", ["v0"])
    store.enqueue(FILTER, ["alpha.v1"], project_ids=[project_id(store, "alpha")], video_ids=["v1"])
    [lease], _ = store.claim_keys(FILTER, ["alpha.v1"], "filter-run")
    store.fail(lease, "CUDA error")  # the last member waits for a retry
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE dataminer.work_items SET next_attempt_at = now() + interval '1 hour'")
        )
    assert ahead_requests(tick("work", instance, db), "project") == []

    with engine.begin() as c:
        c.execute(sa.text("UPDATE dataminer.work_items SET next_attempt_at = now()"))
    result = tick("work", instance, db)  # the filter is requested again, and the project ahead
    assert [covered(r, ["alpha.v0", "alpha.v1"]) for r in ready_requests(result, "filter")] == [
        ["alpha.v1"]
    ]
    [ahead] = ahead_requests(result, "project")
    assert ahead.tags[STAGES_TAG] == "dedup,detect,dataset"
    assert (ahead.tags[RANGE_START], ahead.tags[RANGE_END]) == ("alpha", "alpha")
    assert project_row(engine, "alpha").stage == "active"


# --- project transitions -------------------------------------------------------------------------


def project_id(store: LeaseStore, project: str) -> int:
    with store.engine.connect() as c:
        return c.execute(
            sa.text("SELECT id FROM dataminer.projects WHERE name = :n"), {"n": project}
        ).scalar_one()


def finish_members(store: LeaseStore, project: str, video_ids: Sequence[str]) -> None:
    """Members filtered, their items carrying their project and video as the catalog's do."""
    for v in video_ids:
        store.mark(
            FILTER,
            f"{project}.{v}",
            DONE,
            "filtered in a test",
            project_id=project_id(store, project),
            video_id=v,
        )


def extracted(store: LeaseStore, project: str, video_ids: Sequence[str]) -> None:
    """Members downloaded and extracted (e.g. shared with another project): their filter is left."""
    for v in video_ids:
        store.mark(DOWNLOAD, v, DONE, "downloaded in a test")
        store.mark(FRAMES, v, DONE, "extracted in a test")
    store.enqueue(
        FILTER,
        [f"{project}.{v}" for v in video_ids],
        project_ids=[project_id(store, project)] * len(video_ids),
        video_ids=list(video_ids),
    )


def run_stage(store: LeaseStore, stage: str, project: str, owner: str = "stage-run") -> None:
    [lease], _ = store.claim_keys(stage, [project], owner)
    assert store.complete(lease)


def test_transitions_take_a_project_through_its_stages_to_complete(
    instance, db, catalog, store, engine
):
    add_project(catalog, "alpha", ["v0", "v1"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    extracted(store, "alpha", ["v0", "v1"])
    finish_members(store, "alpha", ["v0"])

    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "active", "one member is not finished"

    finish_members(store, "alpha", ["v1"])
    moved = tick("work", instance, db)
    assert project_row(engine, "alpha").stage == DEDUP
    assert work_items(engine, DEDUP)["alpha"].status == PENDING
    [run] = ready_requests(moved, "project")  # in the tick that moved it
    assert (run.tags[RANGE_START], run.tags[STAGES_TAG]) == ("alpha", "dedup,detect,dataset")

    for stage, following in ((DEDUP, DETECT), (DETECT, DATASET), (DATASET, "complete")):
        tick("work", instance, db)
        assert project_row(engine, "alpha").stage == stage, "waits for the stage's item"
        run_stage(store, stage, "alpha")
        tick("work", instance, db)
        assert project_row(engine, "alpha").stage == following
        if following != "complete":
            assert work_items(engine, following)["alpha"].status == PENDING


def test_members_that_died_upstream_count_as_finished(instance, db, catalog, store, engine):
    add_project(catalog, "alpha", ["v0", "v1", "v2"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    store.mark(DOWNLOAD, "v1", DEAD, "HTTP 404")
    store.mark(FRAMES, "v2", DEAD, "moov atom not found")
    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == DEDUP


def test_new_videos_reopen_a_complete_project(instance, db, catalog, store, engine):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("work", instance, db)
    for stage in (DEDUP, DETECT, DATASET):
        run_stage(store, stage, "alpha")
        tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "complete"

    link(catalog, alpha, ["v1"])
    extracted(store, "alpha", ["v1"])
    tick("work", instance, db)
    row = project_row(engine, "alpha")
    assert row.stage == "active" and row.error is None
    assert "alpha" not in work_items(engine, DEDUP), "the old project-stage results are forgotten"

    finish_members(store, "alpha", ["v1"])
    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == DEDUP
    assert work_items(engine, DEDUP)["alpha"].status == PENDING


def test_a_running_dedup_is_never_disturbed_by_new_videos(instance, db, catalog, store, engine):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("work", instance, db)
    [lease], _ = store.claim_keys(DEDUP, ["alpha"], "dedup-run")

    link(catalog, alpha, ["v1"])
    extracted(store, "alpha", ["v1"])
    for _ in range(2):
        tick("work", instance, db)
    running = work_items(engine, DEDUP)["alpha"]
    assert project_row(engine, "alpha").stage == DEDUP
    assert (running.status, running.lease_token) == (RUNNING, lease.token)

    # Once the dedup is over, the project reopens for the new video instead of moving on.
    assert store.complete(lease)
    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "active"
    assert "alpha" not in work_items(engine, DETECT)


def test_a_member_still_downloading_keeps_its_project_active(instance, db, catalog, store, engine):
    # v1 has a pending download and no frames or filter item yet: a member whose missing items
    # make "finished" NULL must still count as unfinished.
    add_project(catalog, "alpha", ["v0", "v1"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "active", "dedup must wait for v1"


def test_a_new_video_still_to_download_reopens_a_complete_project(
    instance, db, catalog, store, engine
):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("work", instance, db)
    for stage in (DEDUP, DETECT, DATASET):
        run_stage(store, stage, "alpha")
        tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "complete"
    link(catalog, alpha, ["v1"])  # a new video: its download is queued
    tick("work", instance, db)
    assert project_row(engine, "alpha").stage == "active"


def test_a_dead_project_stage_fails_the_project_with_its_error(
    instance, db, catalog, store, engine
):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("work", instance, db)
    run_stage(store, DEDUP, "alpha")
    tick("work", instance, db)
    [lease], _ = store.claim_keys(DETECT, ["alpha"], "detect-run")
    store.fail(lease, "CUDA out of memory", retryable=False)

    tick("work", instance, db)
    row = project_row(engine, "alpha")
    assert row.stage == "failed"
    assert row.error == "detect failed: CUDA out of memory"

    # New videos bring a failed project back.
    link(catalog, alpha, ["v1"])
    tick("work", instance, db)
    row = project_row(engine, "alpha")
    assert (row.stage, row.error) == ("active", None)


def test_a_project_without_videos_or_with_a_dead_catalog_fails(
    instance, db, catalog, store, engine
):
    add_project(catalog, "empty")
    store.mark(CATALOG, "empty", DONE, "no video matched")
    add_project(catalog, "broken")
    store.mark(CATALOG, "broken", DEAD, "search failed: HTTP 429")
    tick("work", instance, db)
    assert project_row(engine, "empty").error == "no video was found for this project"
    assert project_row(engine, "broken").error == "catalog failed: search failed: HTTP 429"


# --- lease reaper --------------------------------------------------------------------------------


def hold(
    store: LeaseStore, owner: str, keys: Sequence[str], begun: Sequence[str] | None = None
) -> None:
    """`owner` claims `keys` and begins those in `begun` (all by default)."""
    store.enqueue(DOWNLOAD, keys)
    store.liveness.heartbeat(owner, socket.gethostname(), 1)
    leases, _ = store.claim_keys(DOWNLOAD, keys, owner)
    assert len(leases) == len(keys)
    for lease in leases:
        if begun is None or lease.key in begun:
            store.mark_started(lease)


def test_reaper_takes_back_the_leases_of_a_run_that_stopped_heartbeating(
    instance, db, store, engine, monkeypatch, tmp_path
):
    db = with_settings(db, monkeypatch, tmp_path, leases=SHORT_LEASES)
    hold(store, "stale-run", ["v0", "v1"], begun=["v0"])
    make_silent(engine, ["stale-run"], longer_than_s=SHORT_LEASES["stale_after_s"])
    hold(store, "live-run", ["v2"])
    result = tick("lease_reaper", instance, db)
    assert isinstance(result, dg.SkipReason) and result.skip_message == "reaped 2 leases"
    rows = work_items(engine, DOWNLOAD)
    for key in ("v0", "v1"):
        assert rows[key].lease_owner is None
        assert rows[key].last_error.startswith("lease expired: run stale-run")
    assert (rows["v0"].status, rows["v0"].attempts) == (FAILED, 1), (
        "a begun item counts the attempt"
    )
    assert (rows["v1"].status, rows["v1"].attempts) == (PENDING, 0), "an item never begun does not"
    assert (rows["v2"].status, rows["v2"].lease_owner) == (RUNNING, "live-run")
    assert tick("lease_reaper", instance, db).skip_message == "every lease belongs to a live run"


def test_reaper_frees_the_leases_of_a_run_the_instance_reports_finished(
    instance, db, store, engine
):
    failed = add_run(instance, DOWNLOAD, dg.DagsterRunStatus.FAILURE)
    succeeded = add_run(instance, DOWNLOAD, dg.DagsterRunStatus.SUCCESS)
    started = add_run(instance, DOWNLOAD, dg.DagsterRunStatus.STARTED)
    hold(store, failed.run_id, ["v0"])
    hold(store, succeeded.run_id, ["v1"])
    hold(store, started.run_id, ["v2"])

    result = tick("lease_reaper", instance, db)  # every heartbeat is fresh
    assert result.skip_message == "reaped 2 leases"
    rows = work_items(engine, DOWNLOAD)
    assert rows["v0"].status == rows["v1"].status == FAILED
    assert failed.run_id in rows["v0"].last_error
    assert (rows["v2"].status, rows["v2"].lease_owner) == (RUNNING, started.run_id)


def test_reaper_with_no_leases_skips(instance, db):
    assert tick("lease_reaper", instance, db).skip_message == "every lease belongs to a live run"


def with_settings(db: DatabaseResource, monkeypatch, tmp_path, **sections) -> DatabaseResource:
    """The resource as it is set up once these settings are in the settings file."""
    import yaml

    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(sections))
    monkeypatch.setenv("DATAMINER_SETTINGS", str(path))
    return DatabaseResource(database_url=db.database_url, data_dir=db.data_dir)


def failure_message(instance: dg.DagsterInstance, run_id: str, event: DagsterEventType) -> str:
    [record] = instance.all_logs(run_id, of_type=event)
    return record.dagster_event.message


def test_reaper_fails_a_run_that_stopped_heartbeating_and_frees_its_pool_slot(
    instance, db, store, engine, monkeypatch, tmp_path
):
    """The issue-10 zombie: a run worker SIGKILLed under the default launcher stays STARTED for
    ever in Dagster and keeps its `gpu` slot; its heartbeat tells it is dead."""
    zombie = add_run(instance, FILTER, dg.DagsterRunStatus.STARTED)
    live = add_run(instance, FILTER, dg.DagsterRunStatus.STARTED)
    hold(store, zombie.run_id, ["v0"])
    db = with_settings(db, monkeypatch, tmp_path, leases=SHORT_LEASES)
    make_silent(engine, [zombie.run_id], longer_than_s=SHORT_LEASES["stale_after_s"])
    hold(store, live.run_id, ["v1"])
    events = instance.event_log_storage
    events.set_concurrency_slots("gpu", 1)
    assert events.claim_concurrency_slot("gpu", zombie.run_id, "filter_lane").is_claimed

    result = tick("lease_reaper", instance, db)
    assert result.skip_message == "ended 1 dead runs; reaped 1 leases"
    assert instance.get_run_by_id(zombie.run_id).status == dg.DagsterRunStatus.FAILURE
    message = failure_message(instance, zombie.run_id, DagsterEventType.RUN_FAILURE)
    assert re.search(r"Failed by dataminer: no heartbeat for \d+ s", message), message
    assert events.get_concurrency_info("gpu").claimed_slots == [], "its gpu slot is free again"
    assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.STARTED
    rows = work_items(engine, DOWNLOAD)
    assert rows["v0"].status == FAILED and rows["v0"].lease_owner is None
    assert rows["v1"].lease_owner == live.run_id


def test_reaper_fails_runs_that_never_heartbeat_and_cancels_runs_never_started(
    instance, db, engine, monkeypatch, tmp_path
):
    db = with_settings(
        db, monkeypatch, tmp_path, runs={"start_grace_s": 0.5, "queued_timeout_s": 0.5}
    )
    never_beat = add_run(instance, FILTER, dg.DagsterRunStatus.STARTED)
    never_queued = add_run(instance, DOWNLOAD, dg.DagsterRunStatus.NOT_STARTED)
    never_dequeued = add_run(instance, DOWNLOAD, dg.DagsterRunStatus.QUEUED)
    someone_elses = instance.add_run(
        DagsterRun(job_name="reports", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED)
    )
    # The reaper's first sight of them starts their grace, on the database's clock.
    assert tick("lease_reaper", instance, db).skip_message == "every lease belongs to a live run"
    time.sleep(1.0)
    assert tick("lease_reaper", instance, db).skip_message == "ended 3 dead runs"

    assert instance.get_run_by_id(never_beat.run_id).status == dg.DagsterRunStatus.FAILURE
    assert "never reported a heartbeat" in failure_message(
        instance, never_beat.run_id, DagsterEventType.RUN_FAILURE
    )
    for run in (never_queued, never_dequeued):
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED
    assert "queued for" in failure_message(
        instance, never_dequeued.run_id, DagsterEventType.RUN_CANCELED
    )
    assert instance.get_run_by_id(someone_elses.run_id).status == dg.DagsterRunStatus.STARTED


def test_leases_held_far_longer_than_their_stage_usually_takes_are_reported_once(
    instance, db, store, engine, monkeypatch, tmp_path
):
    db = with_settings(db, monkeypatch, tmp_path, long_running={"factor": 10, "min_s": 5})
    hold(store, "earlier-run", ["d0", "d1", "d2"])
    with engine.begin() as c:  # three finished downloads that took 2 s each
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'done', lease_token = NULL,
                              lease_owner = NULL, finished_at = now(),
                              started_at = now() - interval '2 seconds'
                        WHERE item_key IN ('d0', 'd1', 'd2')""")
        )
    hold(store, "slow-run", ["v0", "v1"])
    with engine.begin() as c:  # v0 began 100 s ago (50x the usual), v1 just now
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET started_at = now() - interval '100 seconds'
                        WHERE item_key = 'v0'""")
        )

    [slow] = store.liveness.long_running(db.settings.long_running)
    assert (slow.stage, slow.key, slow.owner) == (DOWNLOAD, "v0", "slow-run")
    assert slow.usual_s == pytest.approx(2.0, abs=0.1)
    assert "running for 1m40s in run slow-run; its stage's items usually take 2s" in (
        slow.describe()
    )

    with dg.build_sensor_context(instance=instance, resources={"db": db}) as context:
        assert SENSORS["lease_reaper"](context).skip_message == "1 long-running leases"
        assert json.loads(context.cursor) == [str(slow.token)], "remembered: warned once"


# --- run failure / cancellation ------------------------------------------------------------------


def _status_context(instance, db, run: DagsterRun, event_type: DagsterEventType, sensor: str):
    [record] = instance.all_logs(run.run_id, of_type=event_type)
    return dg.build_run_status_sensor_context(
        sensor_name=sensor,
        dagster_event=record.dagster_event,
        dagster_instance=instance,
        dagster_run=instance.get_run_by_id(run.run_id),
        resources={"db": db},
    )


def _batch_run(instance, catalog, store, engine, status: dg.DagsterRunStatus) -> DagsterRun:
    """A sensor-requested run for v0..v3 that claimed v0..v2 and began v0 and v1 before it ended;
    v4 is in no batch."""
    keys = ["v0", "v1", "v2", "v3", "v4"]
    add_project(catalog, "p", keys)  # their downloads are queued
    ids = {k: r.id for k, r in work_items(engine, DOWNLOAD).items()}
    with engine.begin() as c:
        c.execute(sa.text("UPDATE dataminer.work_items SET requested_at = now()"))
    run = add_run(instance, DOWNLOAD, status, **{BATCH_TAG: f"{ids['v0']}-{ids['v3']}"})
    store.liveness.heartbeat(run.run_id, socket.gethostname(), 1)
    leases, _ = store.claim_keys(DOWNLOAD, ["v0", "v1", "v2"], run.run_id)
    assert len(leases) == 3
    for lease in leases[:2]:
        store.mark_started(lease)  # v2 is claimed but never begun
    return run


def test_release_failed_runs_frees_the_leases_and_the_batch(instance, db, catalog, store, engine):
    run = _batch_run(instance, catalog, store, engine, dg.DagsterRunStatus.STARTED)
    instance.report_run_failed(run)
    context = _status_context(
        instance, db, run, DagsterEventType.RUN_FAILURE, "release_failed_runs"
    )
    with context.for_run_failure() as failure_context:
        SENSORS["release_failed_runs"](failure_context)

    rows = work_items(engine, DOWNLOAD)
    for key in ("v0", "v1"):
        assert rows[key].status == FAILED and rows[key].lease_owner is None
        assert rows[key].attempts == 1, "a failed run's attempt counts"
        assert rows[key].last_error == f"run {run.run_id} failed"
    assert (rows["v2"].status, rows["v2"].attempts) == (PENDING, 0), "never begun: not counted"
    assert all(rows[k].requested_at is None for k in ("v0", "v1", "v2", "v3"))
    assert rows["v4"].requested_at is not None, "items outside the run's batch keep their request"


def test_release_cancelled_runs_frees_the_leases_without_counting_the_attempt(
    instance, db, catalog, store, engine
):
    run = _batch_run(instance, catalog, store, engine, dg.DagsterRunStatus.CANCELING)
    instance.report_run_canceled(run)
    context = _status_context(
        instance, db, run, DagsterEventType.RUN_CANCELED, "release_cancelled_runs"
    )
    with context:
        SENSORS["release_cancelled_runs"](context)

    rows = work_items(engine, DOWNLOAD)
    for key in ("v0", "v1", "v2"):
        assert (rows[key].status, rows[key].attempts, rows[key].lease_owner) == (PENDING, 0, None)
        assert rows[key].last_error == f"run {run.run_id} was cancelled"
    assert all(rows[k].requested_at is None for k in ("v0", "v1", "v2", "v3"))
    assert rows["v4"].requested_at is not None

    # The work sensor asks for the released batch again at once.
    [again] = ready_requests(tick("work", instance, db), "video")
    assert (again.tags[RANGE_START], again.tags[RANGE_END]) == ("v0", "v3")
