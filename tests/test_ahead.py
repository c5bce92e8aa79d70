"""Runs requested ahead of their input wait for it in their database resource (before any step, so
before any pool slot), and stop waiting once nothing they need is still coming."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DONE
from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
from dataminer_dagster.lanes import DEFAULT_LANES
from dataminer_dagster.registry import CATALOG, DEDUP, DOWNLOAD, FILTER, FRAMES
from dataminer_dagster.resources.ahead import is_ahead, wait_for_input
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.tags import AHEAD_TAG, LANE_TAG, RANGE_END, RANGE_START
from dataminer_dagster.testing import instance_for_test
from tests.helpers.pipeline import work_items


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


def project_with_videos(catalog: Catalog, instance, name: str, videos: list[str]) -> None:
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"urls": ["https://example.com/placeholder.mp4"]},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    project = catalog.projects.register(config).project
    with catalog.engine.begin() as conn:
        catalog.videos.link(
            conn, project, [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in videos]
        )
        catalog.advance_videos(conn, videos)
    catalog.store.mark(CATALOG, name, DONE, "catalog done in a test")
    plan_discovery(catalog.engine, DiscoveryCursor()).apply(instance)


def ahead_run(lane: str, start: str, end: str) -> DagsterRun:
    return DagsterRun(
        job_name=f"{lane}_job",
        run_id=str(uuid.uuid4()),
        tags={LANE_TAG: lane, AHEAD_TAG: "true", RANGE_START: start, RANGE_END: end},
    )


def test_a_re_executed_ahead_run_does_not_wait():
    """The UI's Re-execute copies the tags, `dataminer/ahead` included: the copy is about work
    that was there when the first run ran, so it goes ahead at once."""
    first = ahead_run("filter", "alpha.v0", "alpha.v1")
    again = first.with_tags(first.tags)._replace(parent_run_id=first.run_id)
    assert is_ahead(first)
    assert not is_ahead(again)
    assert not is_ahead(None)


def wait_in_thread(store, instance, run, max_wait_s: float = 60):
    said: list[str] = []
    outcome: dict = {}

    def wait():
        outcome["waited"] = wait_for_input(
            store, instance, run, max_wait_s=max_wait_s, log=said.append
        )

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, outcome, said


def test_a_filter_run_waits_until_its_videos_are_extracted(instance, store, catalog, engine):
    project_with_videos(catalog, instance, "alpha", ["v0", "v1"])
    downloads, _ = store.claim_keys(DOWNLOAD, ["v0", "v1"], "video-run")
    thread, outcome, said = wait_in_thread(
        store, instance, ahead_run("filter", "alpha.v0", "alpha.v1")
    )
    time.sleep(1.0)
    assert thread.is_alive(), "both videos are still downloading"
    assert said == [
        "requested ahead: waiting for 2 of 2 partitions that runs in flight are still "
        "producing (at most 60 s)"
    ]

    # The video run finishes its downloads, queueing the extractions it does next (so they
    # count as requested), then extracts, which queues each project's filter.
    video_run = Catalog(engine, store, catalog.paths, requested_stages=frozenset({FRAMES}))
    for lease in downloads:
        with store.completing(lease) as conn:
            downloaded = catalog.paths.root / "videos" / f"{lease.key}.mp4"
            downloaded.parent.mkdir(parents=True, exist_ok=True)
            downloaded.write_bytes(b"a video")
            video_run.videos.record_file(conn, lease.key, str(downloaded), {})
            video_run.advance_videos(conn, [lease.key])
    assert all(r.requested_at is not None for r in work_items(engine, FRAMES).values())
    frames, _ = store.claim_keys(FRAMES, ["v0", "v1"], "video-run")
    time.sleep(0.6)
    assert thread.is_alive(), "extracting"
    alpha = catalog.projects.get("alpha").id
    for lease in frames:
        store.complete(lease)
        store.enqueue(FILTER, [f"alpha.{lease.key}"], project_ids=[alpha], video_ids=[lease.key])
    thread.join(10)
    assert not thread.is_alive()
    assert 1.5 < outcome["waited"] < 10
    assert said[-1].startswith("input ready after")


def test_a_project_run_waits_for_its_last_filter_then_moves_the_project_on(
    instance, store, catalog, engine
):
    project_with_videos(catalog, instance, "alpha", ["v0"])
    for stage in (DOWNLOAD, FRAMES):
        store.mark(stage, "v0", DONE, "done in a test")
    store.enqueue(
        FILTER, ["alpha.v0"], project_ids=[catalog.projects.get("alpha").id], video_ids=["v0"]
    )
    [filtering], _ = store.claim_keys(FILTER, ["alpha.v0"], "filter-run")
    thread, outcome, _ = wait_in_thread(store, instance, ahead_run("project", "alpha", "alpha"))
    time.sleep(1.0)
    assert thread.is_alive()

    assert store.complete(filtering)
    thread.join(10)
    assert not thread.is_alive()
    assert work_items(engine, DEDUP)["alpha"].status == "pending", (
        "the waiting run moved its project to dedup itself, without waiting for a sensor tick"
    )


def test_nothing_in_flight_means_a_short_wait_for_a_request(instance, store, catalog):
    """Work released by a dead run is pending, unrequested, until the sensor's next tick: the
    run waits a moment for it to come, then goes ahead."""
    project_with_videos(catalog, instance, "alpha", ["v0"])  # its download waits, unrequested
    said: list[str] = []
    run = ahead_run("filter", "alpha.v0", "alpha.v0")
    waited = wait_for_input(store, instance, run, max_wait_s=60, log=said.append, settle_s=1.0)
    assert waited >= 1.0
    assert said == ["nothing has been coming for 1 s; going ahead"]


def test_a_run_gives_up_waiting_after_its_limit(instance, store, catalog):
    project_with_videos(catalog, instance, "alpha", ["v0"])
    store.claim_keys(DOWNLOAD, ["v0"], "video-run-that-hangs")
    said: list[str] = []
    run = ahead_run("filter", "alpha.v0", "alpha.v0")
    waited = wait_for_input(store, instance, run, max_wait_s=1.0, log=said.append)
    assert waited >= 1.0
    assert said[-1] == "gave up waiting at the limit of 1 s; 1 partitions are still coming"


@pytest.mark.parametrize(
    "lane", [lane for lane in DEFAULT_LANES if lane.warm_up], ids=lambda lane: lane.name
)
def test_every_module_a_lane_warms_up_exists(lane):
    # The warm-up skips a module that fails to import (an optional library), so a misspelt name
    # would warm nothing, silently: every name must import where the extras are installed.
    import importlib

    for name in lane.warm_up:
        assert importlib.import_module(name).__name__ == name
