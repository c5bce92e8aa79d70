"""File changes fenced by their lease (core/files.py, db/file_changes.py, engine/stage.py): a worker
whose lease was reaped without its knowing (its heartbeats stopped getting through) deletes none of
the new holder's files and publishes nothing, and the new holder removes what the dead lease left.
Two workers, each with its own `db` resource and run heartbeat, on real PostgreSQL; downloads with
real yt-dlp from a local HTTP server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import Candidate, video_id_for_url
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.file_changes import committing, file_changes, forget_staged
from dataminer_dagster.db.leases import Lease, LeaseLost, LeaseStore
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.registry import DOWNLOAD, FRAMES
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import YtDlpClient
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import work_items, write_videos

# The reaper's view of a run that stopped beating; the workers' own leases go stale after the
# settings' default (120 s), so neither fences itself: it does not know its lease is gone.
REAPED_AFTER_S = 1.0


@contextmanager
def _worker(run_id: str, database_url: str, data_dir: Path, instance) -> Iterator[StageContext]:
    """A run's stage context: its `db` resource set up for run `run_id` (its heartbeat beating)."""
    db = DatabaseResource(database_url=database_url, data_dir=str(data_dir), heartbeat_seconds=0.5)
    run = dg.DagsterRun(job_name="fenced_files", run_id=run_id)
    # The asset context is closed here, in turn with the resources: left to the garbage
    # collector, two workers' contexts close in any order, and the instance each one entered
    # stays Dagster's current one for the next test in this process, dead by then.
    with (
        dg.build_resources({"db": db}, instance=instance, dagster_run=run) as built,
        dg.build_asset_context(resources={"download_client": YtDlpClient()}) as context,
    ):
        yield StageContext(context, built.db)


def _reaped_and_taken_over(
    store: LeaseStore,
    a: StageContext,
    b: StageContext,
    stage: str,
    key: str,
    meanwhile: Callable[[StageContext], None] = lambda item: None,
) -> tuple[Lease, Lease]:
    """Worker A claims and begins the item (and does `meanwhile` with its item's context); its
    heartbeats stop; the reaper takes its lease; worker B claims and begins the item. Returns
    both leases."""
    [lease_a] = a.db.leases.claim_next(stage, 1)
    a.db.leases.begin(lease_a)
    meanwhile(a.for_item(lease_a))
    a.db.leases.stop()  # A's heartbeats stop getting through
    time.sleep(REAPED_AFTER_S + 0.5)
    reaped = store.liveness.reap(stale_after_s=REAPED_AFTER_S)
    assert [(r.key, r.owner) for r in reaped] == [(key, lease_a.owner)]
    [lease_b], _ = b.db.leases.claim_keys(stage, [key], respect_backoff=False)
    b.db.leases.begin(lease_b)
    return lease_a, lease_b


def test_a_worker_whose_lease_was_reaped_leaves_the_new_holders_files_alone(
    dataminer_env, database_url, engine, tmp_path
):
    store = LeaseStore(engine)
    store.enqueue(FRAMES, ["v0"])
    data_dir = tmp_path / "data"
    final = data_dir / "frames" / "v0" / "profile"
    with (
        instance_for_test() as instance,
        _worker("run-a", database_url, data_dir, instance) as run_a,
        _worker("run-b", database_url, data_dir, instance) as run_b,
    ):
        staged: list[Path] = []

        def stage_a_frame(a: StageContext) -> None:
            staged.append(a.staging_path(final))
            staged[0].mkdir()
            (staged[0] / "frame.jpg").write_text("A's frame")

        lease_a, lease_b = _reaped_and_taken_over(
            store, run_a, run_b, FRAMES, "v0", meanwhile=stage_a_frame
        )
        [staged_a] = staged
        a, b = run_a.for_item(lease_a), run_b.for_item(lease_b)

        # B, the next holder, removes what A's dead lease left and stages under its own token.
        staged_b = b.staging_path(final)
        assert not staged_a.exists(), "the leftover of a dead lease is removed by the next holder"
        assert lease_b.token.hex in staged_b.name and lease_a.token.hex in staged_a.name
        staged_b.mkdir()
        (staged_b / "frame.jpg").write_text("B's frame")

        # A does not know its lease is gone: its next staging path touches nothing and says so.
        with pytest.raises(LeaseLost):
            a.staging_path(final)
        assert (staged_b / "frame.jpg").read_text() == "B's frame", "B's staging is intact"

        with run_b.db.leases.completing(lease_b, {"by": "B"}) as conn:
            file_changes(conn).publish(staged_b, final)

        # A's late publish is refused and leaves B's output as it is.
        late = tmp_path / "a-output"
        late.mkdir()
        with pytest.raises(LeaseLost), run_a.db.leases.completing(lease_a, {"by": "A"}) as conn:
            file_changes(conn).publish(late, final)
    assert (final / "frame.jpg").read_text() == "B's frame"
    assert sorted(p.name for p in final.parent.iterdir()) == ["profile"], "nothing left beside"
    item = work_items(engine, FRAMES)["v0"]
    assert (item.status, item.attempts, item.outcome) == ("done", 2, {"by": "B"})


def test_a_publish_outside_a_lease_completion_is_refused(engine, tmp_path):
    staged, final = tmp_path / ".staging-out", tmp_path / "out"
    staged.mkdir()
    with (
        pytest.raises(RuntimeError, match="only be published in the transaction of a lease"),
        committing(engine) as conn,
    ):
        file_changes(conn).publish(staged, final)
    assert staged.is_dir() and not final.exists()


@pytest.fixture
def served(tmp_path: Path):
    root = tmp_path / "www"
    spec = SyntheticVideoSpec(width=160, height=120, fps=10, seconds=1.0)
    write_videos(root, {"clip.mp4": spec})
    with LocalHTTPServer(root) as server:
        yield server


def _queued_download(engine, data_dir: Path, url: str) -> str:
    """A project with one video at `url`, its download queued; returns the video's id."""
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"urls": [url]},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    project = catalog.projects.register(config).project
    video_id = video_id_for_url(url)
    with engine.begin() as conn:
        catalog.videos.link(conn, project, [Candidate(video_id, "url", url=url)])
        catalog.advance_videos(conn, [video_id])
    return video_id


def _download(ctx: StageContext, lease: Lease) -> None:
    """The download stage's work on the item and its completion, as the stage machinery runs
    them."""
    result = downloads.process(StageItem(lease), ctx)
    with ctx.db.leases.completing(lease, result.outcome) as conn:
        result.commit(conn)


def test_a_download_by_a_lost_lease_does_not_replace_the_live_holders_video(
    dataminer_env, database_url, engine, served, tmp_path
):
    data_dir = tmp_path / "data"
    video_id = _queued_download(engine, data_dir, served.url("/clip.mp4"))
    videos = DataPaths(data_dir).videos_dir
    with (
        instance_for_test() as instance,
        _worker("run-a", database_url, data_dir, instance) as run_a,
        _worker("run-b", database_url, data_dir, instance) as run_b,
    ):
        lease_a, lease_b = _reaped_and_taken_over(
            LeaseStore(engine), run_a, run_b, DOWNLOAD, video_id
        )
        b = run_b.for_item(lease_b)
        result_b = downloads.process(StageItem(lease_b), b)
        [fetched_by_b] = [p for p in videos.rglob(f"{video_id}.*") if p.is_file()]
        inode_b = fetched_by_b.stat().st_ino

        # A, unaware that its lease is gone, downloads the same video before B's completion.
        with pytest.raises(LeaseLost):
            _download(run_a.for_item(lease_a), lease_a)

        with run_b.db.leases.completing(lease_b, result_b.outcome) as conn:
            result_b.commit(conn)
    item = work_items(engine, DOWNLOAD)[video_id]
    assert (item.status, item.attempts) == ("done", 2)
    published = videos / f"{video_id}.mp4"
    assert published.stat().st_ino == inode_b, "the file is B's, not replaced by A's download"
    assert not [p for p in videos.iterdir() if lease_a.token.hex in p.name], "A wrote nothing"


def test_the_lease_reaper_removes_what_a_dead_items_worker_left(
    dataminer_env, database_url, engine, tmp_path
):
    """A worker that dies with its staging on disk, on its item's last attempt: no later holder
    will write there, so the lease reaper removes the staging once the lease is dead; a live
    holder's staging beside it stays, and an item that ends normally leaves nothing to look for."""
    from dataminer_dagster.engine.run_health import reap_dead_work
    from dataminer_dagster.settings import LeasePolicy, RetryPolicy, RunPolicy

    store = LeaseStore(engine, RetryPolicy(max_attempts=1))
    store.enqueue(FRAMES, ["v0", "v1", "v2"])
    data_dir = tmp_path / "data"
    final = {key: data_dir / "frames" / key / "profile" for key in ("v0", "v1", "v2")}
    lease = LeasePolicy(heartbeat_s=0.5, stale_after_s=REAPED_AFTER_S)
    with (
        instance_for_test() as instance,
        _worker("run-a", database_url, data_dir, instance) as run_a,
        _worker("run-b", database_url, data_dir, instance) as run_b,
    ):
        [dying] = run_a.db.leases.claim_keys(FRAMES, ["v0"], respect_backoff=False)[0]
        claimed, _ = run_b.db.leases.claim_keys(FRAMES, ["v1", "v2"], respect_backoff=False)
        live, done = sorted(claimed, key=lambda held: held.key)
        staged = {}
        for ctx, held in ((run_a, dying), (run_b, live), (run_b, done)):
            ctx.db.leases.begin(held)
            staged[held.key] = ctx.for_item(held).staging_path(final[held.key])
            staged[held.key].mkdir()
            (staged[held.key] / "frame.jpg").write_text(held.key)
        with run_b.db.leases.completing(done) as conn:  # as the stage machinery completes
            file_changes(conn).publish(staged["v2"], final["v2"])
            forget_staged(conn, done.token.hex)

        run_a.db.leases.stop()  # A dies: its heartbeats stop, its staging stays
        time.sleep(REAPED_AFTER_S + 0.5)
        reaper = reap_dead_work(instance, store, lease=lease, runs=RunPolicy())

        assert [(r.key, r.status) for r in reaper.reaped] == [("v0", "dead")]
        [left] = reaper.leftovers
        assert dying.token.hex in left.name and not left.exists()
        assert any(f"removed {left}" in line for line in reaper.lines())
        assert sorted(p.name for p in final["v0"].parent.iterdir()) == []
        [kept] = final["v1"].parent.iterdir()
        assert live.token.hex in kept.name and (kept / "frame.jpg").read_text() == "v1"
        assert (final["v2"] / "frame.jpg").read_text() == "v2"
        with engine.connect() as c:
            rows = c.execute(sa.text("SELECT lease_token FROM dataminer.staged_outputs")).scalars()
            assert [token.hex for token in rows] == [live.token.hex], "only the live holder's"
        assert reap_dead_work(instance, store, lease=lease, runs=RunPolicy()).leftovers == []
