"""Issue: catalog -> downloads -> frames through Dagster, with real yt-dlp against a local server."""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from dataminer_dagster.acquisition.video_ids import video_id_for_file, video_id_for_url
from dataminer_dagster.assets.backup.asset import frames_backup
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.catalog.inputs import PROBLEMS_KEPT
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.assets.frames.asset import frames
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import projects_partitions, videos_partitions
from dataminer_dagster.paths import FRAMES_MANIFEST, DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    materialize_partitions,
    materialized_partitions,
    recorded_as_current,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow

SPEC = SyntheticVideoSpec(width=160, height=120, fps=10, seconds=2.0)


@pytest.fixture
def served(tmp_path: Path):
    root = tmp_path / "www"
    root.mkdir()
    good = write_videos(root, {"good.mp4": SPEC, "good.webm": SPEC})
    (root / "notvideo.mp4").write_text("this is not a video\n" * 50)
    (root / "empty.mp4").write_bytes(b"")
    data = good["good.mp4"].read_bytes()
    (root / "truncated.mp4").write_bytes(data[: len(data) // 2])
    with LocalHTTPServer(root) as server:
        server.respond("/missing.mp4", status=404)
        yield server


class _Pipeline:
    """A test's claim database, data directory and Dagster instance, and runs of the stages on
    them as the sensors request them."""

    def __init__(self, engine, database_url: str, data_dir: Path, instance: dg.DagsterInstance):
        self.engine = engine
        self.data_dir = data_dir
        self.instance = instance
        self.catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
        self.resources = resources(database_url, data_dir)

    def catalog_run(self, project: str = "p1", **options) -> dg.ExecuteInProcessResult:
        """A run of the catalog stage for `project`."""
        return materialize_partitions(
            [video_catalog],
            [project],
            instance=self.instance,
            resources=self.resources,
            partitions=projects_partitions,
            **options,
        )

    def run(self, stages, keys, **options) -> dg.ExecuteInProcessResult:
        """A run of video stages for the videos `keys`."""
        return materialize_partitions(
            stages,
            keys,
            instance=self.instance,
            resources=self.resources,
            partitions=videos_partitions,
            **options,
        )


@pytest.fixture
def pipeline(tmp_path, database_url, engine):
    with instance_for_test() as instance:
        yield _Pipeline(engine, database_url, tmp_path / "data", instance)


@pytest.fixture
def hosted_pipeline(tmp_path, database_url, engine, dataminer_env):
    """As `pipeline`, on an instance of the repository's dagster.yaml: Dagster's storages are the
    product's (hosting/instance_storage.py), on this test's database."""
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "dagster.yaml", dagster_home)
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    yield _Pipeline(engine, database_url, dataminer_env / "data", instance)
    instance.dispose()


def _project(server, tmp_path, **extract):
    # Another clip than the served ones: the same bytes would be one video (a copy).
    local = write_videos(tmp_path / "local", {"clip.mp4": replace(SPEC, seed=1)})["clip.mp4"]
    names = ["good.mp4", "good.webm", "missing.mp4", "notvideo.mp4", "empty.mp4", "truncated.mp4"]
    return parse_project_config(
        {
            "name": "p1",
            "inputs": {"urls": [server.url(f"/{n}") for n in names], "files": [str(local)]},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "extract": {"strategy": "time", "every_seconds": 0.5, **extract},
            "filter": {"positive_prompts": ["a thing"]},
        }
    ), local


def test_bad_items_end_in_the_right_state_and_good_ones_get_frames(served, tmp_path, pipeline):
    config, local = _project(served, tmp_path)
    engine, data_dir, catalog = pipeline.engine, pipeline.data_dir, pipeline.catalog
    catalog.projects.register(config)
    ids = {
        name: video_id_for_url(served.url(f"/{name}"))
        for name in [
            "good.mp4",
            "good.webm",
            "missing.mp4",
            "notvideo.mp4",
            "empty.mp4",
            "truncated.mp4",
        ]
    }
    ids["local"] = video_id_for_file(local)

    result = pipeline.catalog_run()
    assert materialized_partitions(result, "video_catalog") == ["p1"]
    assert set(work_items(engine, "download")) == set(ids.values())

    result = pipeline.run([downloads], list(ids.values()), raise_on_error=False)
    # The good videos are done and materialized; the dead ones fail the run, once the batch
    # has gone through, so that Dagster shows them as failed partitions.
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "items are dead" in failure.event_specific_data.error.message
    dl = work_items(engine, "download")
    good = {ids["good.mp4"], ids["good.webm"], ids["local"]}
    assert {k for k, r in dl.items() if r.status == "done"} == good
    assert dl[ids["missing.mp4"]].status == "dead" and "404" in dl[ids["missing.mp4"]].last_error
    assert (
        dl[ids["notvideo.mp4"]].status == "dead"
        and "not a usable video" in dl[ids["notvideo.mp4"]].last_error
    )
    assert dl[ids["empty.mp4"]].status == "dead" and "empty" in dl[ids["empty.mp4"]].last_error
    assert dl[ids["truncated.mp4"]].status == "dead"
    assert sorted(materialized_partitions(result, "downloads")) == sorted(good)
    assert not list((data_dir / "videos").glob("*.part")) and not list(
        (data_dir / "videos").glob(".*")
    )
    assert set(work_items(engine, "frames")) == good, "frames are queued only for downloaded videos"

    result = pipeline.run([frames], sorted(good))
    assert sorted(materialized_partitions(result, "frames")) == sorted(good)
    videos = catalog.videos.get(good)
    assert videos[ids["good.mp4"]].duration_s == pytest.approx(2.0, abs=0.2)
    profiles = catalog.frames.profiles(good)
    for video_id in good:
        [(directory, count)] = profiles[video_id].values()
        manifest = pd.read_parquet(directory / FRAMES_MANIFEST)
        assert count == len(manifest) == 4  # 0.0, 0.5, 1.0, 1.5 s
        assert list(manifest["timestamp"].round(2)) == [0.0, 0.5, 1.0, 1.5]
        assert all((directory / name).is_file() for name in manifest["file_name"])
        # Shared by hard links with datasets: nobody edits a frame in place by mistake.
        assert not any(f.stat().st_mode & 0o222 for f in directory.iterdir())
    assert set(work_items(engine, "filter")) == {f"p1.{v}" for v in good}

    # A second run of everything does no new work.
    again = [
        pipeline.catalog_run(),
        pipeline.run([downloads], list(ids.values())),
        pipeline.run([frames], sorted(good)),
    ]
    # It does say so to Dagster: the done partitions are recorded as current.
    for r in again:
        events = r.get_asset_materialization_events()
        assert r.success and events and all(recorded_as_current(e) for e in events)


def test_single_partition_failure_fails_the_run_with_the_reason(served, tmp_path, pipeline):
    config, _ = _project(served, tmp_path)
    pipeline.catalog.projects.register(config)
    pipeline.catalog_run()
    missing = video_id_for_url(served.url("/missing.mp4"))
    result = pipeline.run([downloads], [missing], raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "404" in failure and missing in failure


def test_a_dead_item_fails_the_run_with_its_reason_and_no_stack(served, tmp_path, hosted_pipeline):
    """The run's failure is the stage's own words about its dead items; Dagster recorded the
    stack of the code that raised it too, which its UI printed under them ("Stack Trace:") as if
    the product had crashed (hosting/described_failures.py)."""
    pipeline = hosted_pipeline
    config, _ = _project(served, tmp_path)
    pipeline.catalog.projects.register(config)
    pipeline.catalog_run()
    missing, good = (video_id_for_url(served.url(f"/{n}")) for n in ("missing.mp4", "good.mp4"))
    result = pipeline.run([downloads], [missing, good], raise_on_error=False)
    assert not result.success
    kept = {
        e.dagster_event_type: e.get_dagster_event()
        for e in pipeline.instance.all_logs(result.run_id)
        if e.is_dagster_event
    }
    step = kept[dg.DagsterEventType.STEP_FAILURE].step_failure_data
    run = kept[dg.DagsterEventType.RUN_FAILURE].event_specific_data
    assert step.user_failure_data.metadata["dead_items"].value == 1
    for error in (step.error, run.error):
        assert error.message.startswith(f"1 items are dead: download {missing}: "), error
        assert "404" in error.message
        assert (error.stack, error.cause, error.context) == ([], None, None)
        assert "Stack Trace" not in error.to_string()


def test_a_backup_run_of_a_video_without_a_backup_is_done_with_nothing_done(
    served, tmp_path, pipeline
):
    """A video none of whose projects names a backup has no backup item: a run for its partition
    (a backfill, the UI's Materialize) records it as done, saying why, rather than leaving it
    without a materialization, which a backfill counts as failed."""
    config, _ = _project(served, tmp_path)
    pipeline.catalog.projects.register(config)
    good = video_id_for_url(served.url("/good.mp4"))
    pipeline.catalog_run()
    pipeline.run([downloads, frames], [good])
    assert good not in work_items(pipeline.engine, "backup")
    result = pipeline.run([frames_backup], [good])
    assert result.success
    (done,) = [
        e.event_specific_data.materialization for e in result.get_asset_materialization_events()
    ]
    assert (done.asset_key, done.partition) == (dg.AssetKey("frames_backup"), good)
    assert done.metadata["outcome"].text.startswith("nothing to do: no backup configured")


def test_frames_reextracts_when_a_project_needs_another_profile_and_refetches_deleted_files(
    served, tmp_path, pipeline
):
    config, _ = _project(served, tmp_path)
    engine, catalog = pipeline.engine, pipeline.catalog
    catalog.projects.register(config)
    good = video_id_for_url(served.url("/good.mp4"))
    pipeline.catalog_run()
    for asset in (downloads, frames):
        pipeline.run([asset], [good])

    # A second project wants other frames of the same video, whose file has been deleted.
    other = config.model_copy(
        update={
            "name": "p2",
            "extract": config.extract.model_copy(
                update={"every_seconds": 1.0, "image_format": "webp"}
            ),
        }
    )
    catalog.projects.register(other)
    video_file = pipeline.data_dir / catalog.videos.get([good])[good].file_path
    video_file.unlink()
    pipeline.catalog_run("p2")
    assert work_items(engine, "download")[good].status == "pending", (
        "the file is gone: fetch it again"
    )
    for asset in (downloads, frames):
        pipeline.run([asset], [good])
    profiles = catalog.frames.profiles([good])[good]
    assert sorted(count for _, count in profiles.values()) == [2, 4]
    webp = [d for d, _ in profiles.values() if list(d.glob("*.webp"))]
    assert len(webp) == 1
    assert work_items(engine, "filter")["p2." + good].status == "pending"
    assert work_items(engine, "filter")["p1." + good].status == "pending"
    shutil.rmtree(webp[0])


def test_frames_whose_commit_fails_leave_no_folder_the_database_does_not_record(
    served, tmp_path, pipeline
):
    """The frames are published in the completion's transaction; a COMMIT refused by a deferred
    constraint takes them off the disk again, and the retry publishes them."""
    config, _ = _project(served, tmp_path)
    engine, data_dir, catalog = pipeline.engine, pipeline.data_dir, pipeline.catalog
    catalog.projects.register(config)
    good = video_id_for_url(served.url("/good.mp4"))
    pipeline.catalog_run()
    pipeline.run([downloads], [good])
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE FUNCTION dataminer.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
            CREATE CONSTRAINT TRIGGER refuse AFTER UPDATE ON dataminer.work_items
              DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
              WHEN (NEW.stage = 'frames' AND NEW.status = 'done')
              EXECUTE FUNCTION dataminer.refuse();
        """)
    failed = pipeline.run([frames], [good], raise_on_error=False)
    assert not failed.success
    assert "refused at commit" in work_items(engine, "frames")[good].last_error
    assert catalog.frames.profiles([good]) == {}
    assert list((data_dir / "frames" / good).iterdir()) == [], "no folder without a row"

    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER refuse ON dataminer.work_items")
    pipeline.run([frames], [good])
    [(directory, count)] = catalog.frames.profiles([good])[good].values()
    assert count == 4 and list((data_dir / "frames" / good).iterdir()) == [directory]


def test_unbounded_downloads_are_stopped_and_a_full_disk_costs_no_attempt(served, pipeline):
    served.stream("/endless.mp4", total_bytes=40 * 2**20)  # no Content-Length
    (served.root / "live.m3u8").write_text(  # no #EXT-X-ENDLIST: a live stream
        "#EXTM3U\n#EXT-X-TARGETDURATION:2\n#EXTINF:2.0,\nsegment0.ts\n"
    )
    names = ["endless.mp4", "live.m3u8", "good.mp4"]
    ids = {name: video_id_for_url(served.url(f"/{name}")) for name in names}

    def config(**download):
        return parse_project_config(
            {
                "name": "p1",
                "inputs": {"urls": [served.url(f"/{n}") for n in names]},
                "download": {"allow_private_networks": True, "max_filesize_mb": 1, **download},
                "filter": {"positive_prompts": ["a thing"]},
            }
        )

    engine, catalog = pipeline.engine, pipeline.catalog
    catalog.projects.register(config(min_free_disk_mb=2**31 - 1))  # 2 PB: the disk is "full"
    pipeline.catalog_run()
    keys = list(ids.values())
    result = pipeline.run([downloads], keys)
    assert result.success
    dl = work_items(engine, "download")
    assert dl[ids["live.m3u8"]].status == "blocked"
    assert "live stream" in dl[ids["live.m3u8"]].last_error
    for name in ("endless.mp4", "good.mp4"):
        item = dl[ids[name]]
        assert (item.status, item.attempts) == ("failed", 0), "the disk's fault, not the video's"
        assert "not enough free disk space" in item.last_error
        assert "download.min_free_disk_mb" in item.last_error

    catalog.projects.register(config())  # space was freed (the default reserve fits)
    pipeline.run([downloads], keys)
    dl = work_items(engine, "download")
    assert dl[ids["good.mp4"]].status == "done"
    endless = dl[ids["endless.mp4"]]
    assert endless.status == "blocked" and "over the limit of 1 MB" in endless.last_error
    sent = [r.bytes_sent for r in served.requests if r.path == "/endless.mp4"]
    assert max(sent) < 6 * 2**20, f"the download went on past the cap: {sent} bytes sent"


def test_a_huge_file_of_bad_urls_logs_the_first_problems_and_a_count(tmp_path, pipeline):
    bad = [f"not a url {n}" for n in range(99_999)]
    url_file = tmp_path / "urls.txt"
    url_file.write_text("\n".join(["https://youtu.be/AAAAAAAAAAA", *bad]))
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"url_file": str(url_file)},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    pipeline.catalog.projects.register(config)
    result = pipeline.catalog_run()
    warnings = [
        e.user_message
        for e in pipeline.instance.all_logs(result.run_id)
        if e.level == logging.WARNING and e.user_message.startswith("p1: ")
    ]
    assert len(warnings) == PROBLEMS_KEPT + 1
    assert (
        warnings[-1]
        == f"p1: {99_999 - PROBLEMS_KEPT} more problems like these are not shown (99999 in all)"
    )
    [item] = work_items(pipeline.engine, "catalog").values()
    assert item.status == "done" and item.outcome == {
        "videos": 1,
        "new_videos": 1,
        "problems": 99_999,
        "refresh": False,
    }


def _catalog_of_url_file(tmp_path, pipeline, content: bytes):
    url_file = tmp_path / "urls.txt"
    url_file.write_bytes(content)
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"url_file": str(url_file)},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    pipeline.catalog.projects.register(config)
    pipeline.catalog_run(raise_on_error=False)
    [item] = work_items(pipeline.engine, "catalog").values()
    return item


def test_a_nul_byte_in_a_url_file_costs_its_line_not_the_project(tmp_path, pipeline):
    """The line passed the URL check and failed the catalog's insert, four times, and the
    project with it."""
    item = _catalog_of_url_file(
        tmp_path,
        pipeline,
        b"https://example.com/a.mp4\nhttp://127.0.0.1:47400/x\x00y.mp4\n"
        b"https://example.com/b.mp4\nhttps://example.com/c.mp4\n",
    )
    assert item.status == "done" and item.outcome["videos"] == 3, item
    assert item.outcome["problems"] == 1


def test_a_url_file_that_cannot_be_used_at_all_is_not_retried(tmp_path, pipeline):
    """Every line is bad for good: the catalog is dead after one attempt, not retried 4 times."""
    item = _catalog_of_url_file(tmp_path, pipeline, b"\xff\xfe\x00\x01\n\xc3\x28\n")
    assert item.status == "dead" and item.attempts == 1, item
    assert "line 1: not UTF-8 text" in item.last_error and "\n" not in item.last_error


def test_a_local_file_longer_than_max_duration_is_left_out_as_a_url_is(tmp_path, pipeline):
    """max_duration_s was applied to downloads only: a local clip of any length was extracted."""
    local = write_videos(tmp_path / "local", {"long.mp4": SPEC})["long.mp4"]  # 2 s
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"files": [str(local)]},
            "download": {"max_duration_s": 1},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    pipeline.catalog.projects.register(config)
    video_id = video_id_for_file(local)
    pipeline.catalog_run()
    pipeline.run([downloads], [video_id])
    rule = work_items(pipeline.engine, "filter")[f"p1.{video_id}"]
    assert rule.status == "blocked" and "over the limit of 1 s" in rule.last_error, rule


def test_a_stored_error_is_cut_to_a_bound_with_a_marker(served, pipeline):
    """Forty 64 KB URLs stored last_error values of 131 KB each and 500 KB log lines."""
    url = served.url("/" + "a" * 7000 + ".mp4")  # not served: 404
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"urls": [url]},
            "download": {"allow_private_networks": True},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    pipeline.catalog.projects.register(config)
    video_id = video_id_for_url(url)
    pipeline.catalog_run()
    result = pipeline.run([downloads], [video_id], raise_on_error=False)
    lines = [e.user_message for e in pipeline.instance.all_logs(result.run_id)]
    item = work_items(pipeline.engine, "download")[video_id]
    assert item.status in ("failed", "dead") and "\n" not in item.last_error
    assert len(item.last_error) < 2100 and "... [cut: " in item.last_error, len(item.last_error)
    assert max(len(line) for line in lines) < 3000


def test_a_private_address_is_one_dead_item_and_the_rest_goes_on(served, tmp_path, pipeline):
    """Nothing checked an address before fetching: a config could reach the local network."""
    url = served.url("/good.mp4")
    local = write_videos(tmp_path / "local", {"clip.mp4": replace(SPEC, seed=1)})["clip.mp4"]
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"urls": [url], "files": [str(local)]},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    pipeline.catalog.projects.register(config)
    ids = [video_id_for_url(url), video_id_for_file(local)]
    pipeline.catalog_run()
    pipeline.run([downloads], ids, raise_on_error=False)
    items = work_items(pipeline.engine, "download")
    refused, local_item = items[ids[0]], items[ids[1]]
    assert refused.status == "dead" and refused.attempts == 1, refused
    assert "connection to 127.0.0.1 refused" in refused.last_error
    assert "download.allow_private_networks: true" in refused.last_error
    assert "\n" not in refused.last_error
    assert local_item.status == "done"
    assert not [r for r in served.requests if r.path == "/good.mp4"], "nothing was sent"
