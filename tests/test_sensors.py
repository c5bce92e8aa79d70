"""The sensors, each invoked with `build_sensor_context` against `instance_for_test()` and a real
claim database, asserting on the SensorResult / SkipReason they return and on the claim tables.

A sensor's partition requests are not applied by invoking it; tests that need the partitions add
them to the instance themselves, as the sensor daemon would.
"""

from __future__ import annotations

import json
import socket
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

from dataminer_dagster.assets import STAGE_ASSETS
from dataminer_dagster.assets.stage import REQUESTED_BY_TAG, STAGE_TAG
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.admin import delete_orphan_videos, delete_project
from dataminer_dagster.db.catalog import Candidate, Catalog, ProjectRow
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DEAD, DONE, FAILED, PENDING, RUNNING
from dataminer_dagster.resources.database import DatabaseResource
from dataminer_dagster.sensors.pipeline_sensors import build_sensors, stage_jobs
from dataminer_dagster.sensors.planning import (
    BATCH_TAG,
    MAX_PARTITION_ADDS_PER_TICK,
    POLICIES,
    RANGE_END,
    RANGE_START,
    DiscoveryCursor,
    plan_discovery,
)
from dataminer_dagster.stages import (
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
    PROJECT_STAGES,
    VIDEO_STAGES,
)
from tests.helpers.pipeline import work_items

JOBS = stage_jobs(STAGE_ASSETS)
SENSORS = {s.name: s for s in build_sensors(STAGE_ASSETS, JOBS)}
JOB_NAMES = {stage: job.name for stage, job in JOBS.items()}


# --- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
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
    project = catalog.register_project(config).project
    link(catalog, project, video_ids)
    return project


def link(catalog: Catalog, project: ProjectRow, video_ids: Sequence[str]) -> None:
    """Link videos to a project as the catalog stage does, queueing what each needs next."""
    candidates = [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in video_ids]
    with catalog.engine.begin() as conn:
        catalog.link_videos(conn, project, candidates)
        catalog.advance_videos(conn, list(video_ids))


def apply_partition_requests(instance: dg.DagsterInstance, result: dg.SensorResult) -> None:
    """What the daemon does with the discovery sensor's requests."""
    for request in result.dynamic_partitions_requests:
        if isinstance(request, dg.DeleteDynamicPartitionsRequest):
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
        else:
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)


def add_partitions(instance: dg.DagsterInstance, db: DatabaseResource) -> None:
    """What the discovery sensor and the daemon do together: every catalog row is a partition."""
    result = tick("discovery", instance, db)
    if isinstance(result, dg.SensorResult):
        apply_partition_requests(instance, result)


def project_row(engine: sa.Engine, name: str) -> sa.Row:
    with engine.connect() as c:
        return c.execute(
            sa.text("SELECT * FROM dataminer.projects WHERE name = :n"), {"n": name}
        ).one()


def add_run(
    instance: dg.DagsterInstance, stage: str, status: dg.DagsterRunStatus, **tags: str
) -> DagsterRun:
    """A run of a stage's job in the instance, as if the daemon had launched (or queued) it."""
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("dataminer"), "__repository__")
    run = DagsterRun(
        job_name=JOB_NAMES[stage],
        run_id=str(uuid.uuid4()),
        status=status,
        tags={STAGE_TAG: stage, **tags},
        remote_job_origin=RemoteJobOrigin(repository, JOB_NAMES[stage]),
    )
    return instance.add_run(run)


def requests_by_stage(result) -> dict[str, list[dg.RunRequest]]:
    assert isinstance(result, dg.SensorResult), result
    grouped: dict[str, list[dg.RunRequest]] = {}
    for request in result.run_requests:
        grouped.setdefault(request.tags[STAGE_TAG], []).append(request)
    return grouped


def batch_ids(request: dg.RunRequest) -> tuple[int, int]:
    first, last = request.tags[BATCH_TAG].split("-")
    return int(first), int(last)


def keys_for(stage: str, n: int) -> list[str]:
    if stage in VIDEO_STAGES:
        return [f"v{i:05d}" for i in range(n)]
    if stage in PROJECT_STAGES:
        return [f"p{i:05d}" for i in range(n)]
    return [f"p.v{i:05d}" for i in range(n)]


# --- discovery -----------------------------------------------------------------------------------


def test_discovery_adds_new_rows_in_discovery_order_and_moves_its_cursor(instance, db, catalog):
    assert isinstance(tick("discovery", instance, db), dg.SkipReason)

    alpha = add_project(catalog, "alpha", ["v2", "v0", "v1"])
    add_project(catalog, "beta", ["v0", "v3"])
    result = tick("discovery", instance, db)

    assert isinstance(result, dg.SensorResult)
    added = {
        r.partitions_def_name: list(r.partition_keys) for r in result.dynamic_partitions_requests
    }
    assert list(added) == ["projects", "videos", "project_videos"]
    assert added["projects"] == ["alpha", "beta"]
    assert added["videos"] == ["v2", "v0", "v1", "v3"], "videos come in the order they were found"
    assert added["project_videos"] == ["alpha.v2", "alpha.v0", "alpha.v1", "beta.v0", "beta.v3"]
    assert all(
        isinstance(r, dg.AddDynamicPartitionsRequest) for r in result.dynamic_partitions_requests
    )
    cursor = json.loads(result.cursor)
    assert set(cursor) == {"project", "video", "project_video"} and all(cursor.values())

    # Nothing new: the cursor keeps the sensor from adding anything twice.
    assert isinstance(tick("discovery", instance, db, result.cursor), dg.SkipReason)

    link(catalog, alpha, ["v4", "v3"])
    again = tick("discovery", instance, db, result.cursor)
    added = {
        r.partitions_def_name: list(r.partition_keys) for r in again.dynamic_partitions_requests
    }
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
    while isinstance(result := tick("discovery", instance, db, cursor), dg.SensorResult):
        ticks += 1
        counts = sum(len(r.partition_keys) for r in result.dynamic_partitions_requests)
        assert counts <= MAX_PARTITION_ADDS_PER_TICK
        for r in result.dynamic_partitions_requests:
            seen[r.partitions_def_name] += r.partition_keys
        apply_partition_requests(instance, result)
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
    first = tick("discovery", instance, db)
    apply_partition_requests(instance, first)

    delete_project(db.store.engine, db.paths, "beta")  # v2 stays, an orphan
    link(catalog, add_project(catalog, "gamma"), ["v3"])
    second = tick("discovery", instance, db, first.cursor)
    assert [type(r) for r in second.dynamic_partitions_requests] == [
        dg.AddDynamicPartitionsRequest
    ] * 3, "new rows first: nothing is removed while partitions are still being added"
    apply_partition_requests(instance, second)

    third = tick("discovery", instance, db, second.cursor)
    removed = {
        r.partitions_def_name: list(r.partition_keys)
        for r in third.dynamic_partitions_requests
        if isinstance(r, dg.DeleteDynamicPartitionsRequest)
    }
    assert removed == {"projects": ["beta"], "project_videos": ["beta.v1", "beta.v2"]}
    apply_partition_requests(instance, third)
    assert instance.get_dynamic_partitions("projects") == ["alpha", "gamma"]
    assert instance.get_dynamic_partitions("videos") == ["v0", "v1", "v2", "v3"]

    delete_orphan_videos(db.store.engine, db.paths)
    apply_partition_requests(instance, tick("discovery", instance, db, third.cursor))
    assert instance.get_dynamic_partitions("videos") == ["v0", "v1", "v3"]
    assert isinstance(tick("discovery", instance, db, third.cursor), dg.SkipReason)


# --- work ----------------------------------------------------------------------------------------


def test_work_requests_only_items_whose_partitions_exist(instance, db, catalog, engine):
    add_project(catalog, "alpha", ["v0", "v1", "v2"])
    skipped = tick("work", instance, db)
    assert isinstance(skipped, dg.SkipReason)
    assert all(r.requested_at is None for r in work_items(engine, DOWNLOAD).values()), (
        "an item that could not be requested is not marked as requested"
    )

    add_partitions(instance, db)
    grouped = requests_by_stage(tick("work", instance, db))
    assert set(grouped) == {CATALOG, DOWNLOAD}
    [catalog_run] = grouped[CATALOG]
    assert catalog_run.job_name == "video_catalog_job"
    assert (catalog_run.tags[RANGE_START], catalog_run.tags[RANGE_END]) == ("alpha", "alpha")
    [download_run] = grouped[DOWNLOAD]
    assert download_run.job_name == "downloads_job"
    assert (download_run.tags[RANGE_START], download_run.tags[RANGE_END]) == ("v0", "v2")
    assert download_run.tags[REQUESTED_BY_TAG] == "sensor"
    downloads = work_items(engine, DOWNLOAD)
    assert batch_ids(download_run) == (downloads["v0"].id, downloads["v2"].id)
    assert all(r.requested_at is not None for r in downloads.values())


def test_work_does_not_request_a_new_partition_until_it_is_added(instance, db, catalog, engine):
    alpha = add_project(catalog, "alpha", ["v0"])
    add_partitions(instance, db)
    requests_by_stage(tick("work", instance, db))
    link(catalog, alpha, ["v1"])  # a row the discovery sensor has not turned into a partition
    assert isinstance(tick("work", instance, db), dg.SkipReason)
    add_partitions(instance, db)
    [run] = requests_by_stage(tick("work", instance, db))[DOWNLOAD]
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("v1", "v1")


@pytest.mark.parametrize("stage", list(STAGE_ASSETS))
def test_work_batches_each_stage_by_its_policy(stage, instance, db, store, engine):
    policy = POLICIES[stage]
    keys = keys_for(stage, policy.batch * policy.max_runs + 3)
    store.enqueue(stage, keys)
    instance.add_dynamic_partitions(STAGE_ASSETS[stage].partitions_def.name, keys)
    ids = {k: r.id for k, r in work_items(engine, stage).items()}

    runs = requests_by_stage(tick("work", instance, db))[stage]
    assert len(runs) == policy.max_runs
    expected = [
        keys[i : i + policy.batch] for i in range(0, policy.batch * policy.max_runs, policy.batch)
    ]
    for run, chunk in zip(runs, expected, strict=True):
        assert run.job_name == JOB_NAMES[stage] == f"{STAGE_ASSETS[stage].key.to_user_string()}_job"
        assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (chunk[0], chunk[-1])
        assert batch_ids(run) == (ids[chunk[0]], ids[chunk[-1]])
        assert run.tags[STAGE_TAG] == stage and run.tags[REQUESTED_BY_TAG] == "sensor"

    # Requested items are not asked for again; the three left over are, on the following ticks.
    later: list[str] = []
    while isinstance(result := tick("work", instance, db), dg.SensorResult):
        runs = requests_by_stage(result)[stage]
        assert len(runs) <= policy.max_runs
        for run in runs:
            start, end = keys.index(run.tags[RANGE_START]), keys.index(run.tags[RANGE_END])
            later += keys[start : end + 1]
    assert later == keys[-3:]


def test_work_ranges_follow_the_partition_order(instance, db, store):
    keys = keys_for(DOWNLOAD, 5)
    store.enqueue(DOWNLOAD, keys)
    instance.add_dynamic_partitions("videos", list(reversed(keys)))
    [run] = requests_by_stage(tick("work", instance, db))[DOWNLOAD]
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (keys[-1], keys[0])


def test_work_requests_no_more_runs_than_a_stage_may_have_in_flight(instance, db, store):
    keys = keys_for(DOWNLOAD, 100)
    store.enqueue(DOWNLOAD, keys)
    instance.add_dynamic_partitions("videos", keys)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.QUEUED)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.STARTED)
    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.SUCCESS)  # finished: does not count
    add_run(instance, FRAMES, dg.DagsterRunStatus.QUEUED)  # another stage's share

    [run] = requests_by_stage(tick("work", instance, db))[DOWNLOAD]
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == (keys[0], keys[24])

    add_run(instance, DOWNLOAD, dg.DagsterRunStatus.NOT_STARTED)
    skipped = tick("work", instance, db)
    assert isinstance(skipped, dg.SkipReason), "three download runs are in flight already"


def test_work_waits_for_the_retry_back_off(instance, db, store, engine):
    store.enqueue(DOWNLOAD, ["v0", "v1"])
    instance.add_dynamic_partitions("videos", ["v0", "v1"])
    [lease] = store.claim_keys(DOWNLOAD, ["v0"], "some-run")[0]
    store.fail(lease, "connection reset")  # a failure whose back-off has not elapsed
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET next_attempt_at = now() + interval '1 hour'
                        WHERE item_key = 'v0'""")
        )
    [run] = requests_by_stage(tick("work", instance, db))[DOWNLOAD]
    assert (run.tags[RANGE_START], run.tags[RANGE_END]) == ("v1", "v1")
    assert work_items(engine, DOWNLOAD)["v0"].status == FAILED


# --- project transitions -------------------------------------------------------------------------


def finish_members(store: LeaseStore, project: str, video_ids: Sequence[str]) -> None:
    for v in video_ids:
        store.mark(FILTER, f"{project}.{v}", DONE, "filtered in a test")


def extracted(store: LeaseStore, project: str, video_ids: Sequence[str]) -> None:
    """Members downloaded and extracted (e.g. shared with another project): their filter is left."""
    for v in video_ids:
        store.mark(DOWNLOAD, v, DONE, "downloaded in a test")
        store.mark(FRAMES, v, DONE, "extracted in a test")
    store.enqueue(FILTER, [f"{project}.{v}" for v in video_ids])


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

    skipped = tick("project_transitions", instance, db)
    assert isinstance(skipped, dg.SkipReason) and skipped.skip_message == "no project can move"
    assert project_row(engine, "alpha").stage == "active", "one member is not finished"

    finish_members(store, "alpha", ["v1"])
    moved = tick("project_transitions", instance, db)
    assert moved.skip_message == "1 project transitions"
    assert project_row(engine, "alpha").stage == DEDUP
    assert work_items(engine, DEDUP)["alpha"].status == PENDING

    for stage, following in ((DEDUP, DETECT), (DETECT, DATASET), (DATASET, "complete")):
        assert isinstance(tick("project_transitions", instance, db), dg.SkipReason)
        assert project_row(engine, "alpha").stage == stage, "waits for the stage's item"
        run_stage(store, stage, "alpha")
        tick("project_transitions", instance, db)
        assert project_row(engine, "alpha").stage == following
        if following != "complete":
            assert work_items(engine, following)["alpha"].status == PENDING


def test_members_that_died_upstream_count_as_finished(instance, db, catalog, store, engine):
    add_project(catalog, "alpha", ["v0", "v1", "v2"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    store.mark(DOWNLOAD, "v1", DEAD, "HTTP 404")
    store.mark(FRAMES, "v2", DEAD, "moov atom not found")
    tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == DEDUP


def test_new_videos_reopen_a_complete_project(instance, db, catalog, store, engine):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("project_transitions", instance, db)
    for stage in (DEDUP, DETECT, DATASET):
        run_stage(store, stage, "alpha")
        tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == "complete"

    link(catalog, alpha, ["v1"])
    extracted(store, "alpha", ["v1"])
    tick("project_transitions", instance, db)
    row = project_row(engine, "alpha")
    assert row.stage == "active" and row.error is None
    assert "alpha" not in work_items(engine, DEDUP), "the old project-stage results are forgotten"

    finish_members(store, "alpha", ["v1"])
    tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == DEDUP
    assert work_items(engine, DEDUP)["alpha"].status == PENDING


def test_a_running_dedup_is_never_disturbed_by_new_videos(instance, db, catalog, store, engine):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("project_transitions", instance, db)
    [lease], _ = store.claim_keys(DEDUP, ["alpha"], "dedup-run")

    link(catalog, alpha, ["v1"])
    extracted(store, "alpha", ["v1"])
    for _ in range(2):
        assert tick("project_transitions", instance, db).skip_message == "no project can move"
    running = work_items(engine, DEDUP)["alpha"]
    assert project_row(engine, "alpha").stage == DEDUP
    assert (running.status, running.lease_token) == (RUNNING, lease.token)

    # Once the dedup is over, the project reopens for the new video instead of moving on.
    assert store.complete(lease)
    tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == "active"
    assert "alpha" not in work_items(engine, DETECT)


def test_a_member_still_downloading_keeps_its_project_active(instance, db, catalog, store, engine):
    # v1 has a pending download and no frames or filter item yet: a member whose missing items
    # make "finished" NULL must still count as unfinished.
    add_project(catalog, "alpha", ["v0", "v1"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == "active", "dedup must wait for v1"


def test_a_new_video_still_to_download_reopens_a_complete_project(
    instance, db, catalog, store, engine
):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("project_transitions", instance, db)
    for stage in (DEDUP, DETECT, DATASET):
        run_stage(store, stage, "alpha")
        tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == "complete"
    link(catalog, alpha, ["v1"])  # a new video: its download is queued
    tick("project_transitions", instance, db)
    assert project_row(engine, "alpha").stage == "active"


def test_a_dead_project_stage_fails_the_project_with_its_error(
    instance, db, catalog, store, engine
):
    alpha = add_project(catalog, "alpha", ["v0"])
    store.mark(CATALOG, "alpha", DONE, "catalog done in a test")
    finish_members(store, "alpha", ["v0"])
    tick("project_transitions", instance, db)
    run_stage(store, DEDUP, "alpha")
    tick("project_transitions", instance, db)
    [lease], _ = store.claim_keys(DETECT, ["alpha"], "detect-run")
    store.fail(lease, "CUDA out of memory", retryable=False)

    tick("project_transitions", instance, db)
    row = project_row(engine, "alpha")
    assert row.stage == "failed"
    assert row.error == "detect failed: CUDA out of memory"

    # New videos bring a failed project back.
    link(catalog, alpha, ["v1"])
    tick("project_transitions", instance, db)
    row = project_row(engine, "alpha")
    assert (row.stage, row.error) == ("active", None)


def test_a_project_without_videos_or_with_a_dead_catalog_fails(
    instance, db, catalog, store, engine
):
    add_project(catalog, "empty")
    store.mark(CATALOG, "empty", DONE, "no video matched")
    add_project(catalog, "broken")
    store.mark(CATALOG, "broken", DEAD, "search failed: HTTP 429")
    assert tick("project_transitions", instance, db).skip_message == "2 project transitions"
    assert project_row(engine, "empty").error == "no video was found for this project"
    assert project_row(engine, "broken").error == "catalog failed: search failed: HTTP 429"


# --- lease reaper --------------------------------------------------------------------------------


def hold(
    store: LeaseStore, owner: str, keys: Sequence[str], begun: Sequence[str] | None = None
) -> None:
    """`owner` claims `keys` and begins those in `begun` (all by default)."""
    store.enqueue(DOWNLOAD, keys)
    store.heartbeat(owner, socket.gethostname(), 1)
    leases, _ = store.claim_keys(DOWNLOAD, keys, owner)
    assert len(leases) == len(keys)
    for lease in leases:
        if begun is None or lease.key in begun:
            store.mark_started(lease)


def test_reaper_takes_back_the_leases_of_a_run_that_stopped_heartbeating(
    instance, db, store, engine
):
    hold(store, "stale-run", ["v0", "v1"], begun=["v0"])
    hold(store, "live-run", ["v2"])
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.run_heartbeats SET heartbeat_at = now() - interval '1 hour'
                        WHERE run_id = 'stale-run'""")
        )
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


def _batch_run(instance, store, engine, status: dg.DagsterRunStatus) -> DagsterRun:
    """A sensor-requested run for v0..v3 that claimed v0..v2 and began v0 and v1 before it ended;
    v4 is in no batch."""
    keys = ["v0", "v1", "v2", "v3", "v4"]
    store.enqueue(DOWNLOAD, keys)
    ids = {k: r.id for k, r in work_items(engine, DOWNLOAD).items()}
    with engine.begin() as c:
        c.execute(sa.text("UPDATE dataminer.work_items SET requested_at = now()"))
    run = add_run(instance, DOWNLOAD, status, **{BATCH_TAG: f"{ids['v0']}-{ids['v3']}"})
    store.heartbeat(run.run_id, socket.gethostname(), 1)
    leases, _ = store.claim_keys(DOWNLOAD, ["v0", "v1", "v2"], run.run_id)
    assert len(leases) == 3
    for lease in leases[:2]:
        store.mark_started(lease)  # v2 is claimed but never begun
    return run


def test_release_failed_runs_frees_the_leases_and_the_batch(instance, db, store, engine):
    run = _batch_run(instance, store, engine, dg.DagsterRunStatus.STARTED)
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
    instance, db, store, engine
):
    run = _batch_run(instance, store, engine, dg.DagsterRunStatus.CANCELING)
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
    instance.add_dynamic_partitions("videos", list(rows))
    [again] = requests_by_stage(tick("work", instance, db))[DOWNLOAD]
    assert (again.tags[RANGE_START], again.tags[RANGE_END]) == ("v0", "v3")
