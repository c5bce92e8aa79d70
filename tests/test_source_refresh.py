"""Sources listed again (issue 27, item 1): feeds served on 127.0.0.1 and read by real yt-dlp,
growing between refreshes; a refresh takes only the new videos, one that finds nothing new
downloads nothing and calls no model, a failing feed is recorded and waits for its back-off, and
the refresh_sources sensor asks for a refresh when a project's cron is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dataminer_dagster.acquisition.ytdlp_search import list_videos
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.config_section import ConfigError
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db import source_refresh
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.reports import source_yield
from dataminer_dagster.engine.refresh_schedule import due_projects, next_refresh, refresh_due
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.http_server import http_server_fixture
from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources, write_videos

http_server = http_server_fixture()


def write_feed(server, clips: list[str], name: str = "feed.xml") -> str:
    """An RSS feed on `server` whose items link to `clips` (file names on the server), the
    newest first, as feeds list them."""
    items = "".join(
        f"<item><title>{clip}</title><link>{server.url('/' + clip)}</link>"
        f"<guid>{clip}</guid></item>"
        for clip in reversed(clips)
    )
    (server.root / name).write_text(
        '<?xml version="1.0" encoding="UTF-8"?><rss version="2.0"><channel>'
        f"<title>clips</title><link>{server.url('/')}</link><description>test</description>"
        f"{items}</channel></rss>"
    )
    return server.url("/" + name)


def clip_files(root: Path, count: int, first: int = 0) -> list[str]:
    written = write_videos(
        root,
        {
            f"clip{i}.mp4": SyntheticVideoSpec(
                width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=i
            )
            for i in range(first, first + count)
        },
    )
    return sorted(written)


def test_a_feed_is_listed_newest_first_and_bounded(http_server):
    clip_files(http_server.root, 3)
    url = write_feed(http_server, ["clip0.mp4", "clip1.mp4", "clip2.mp4"])

    hits = list_videos(url, 2, options=DownloadConfig(allow_private_networks=True))

    assert [h.title for h in hits] == ["clip2.mp4", "clip1.mp4"]
    assert [h.url for h in hits] == [http_server.url("/clip2.mp4"), http_server.url("/clip1.mp4")]
    assert all("smuggle" not in h.url for h in hits)


class Following:
    """A project that follows a feed on 127.0.0.1, with a Dagster instance to drive it."""

    def __init__(self, tmp_path, database_url, engine, server, siglip):
        self.server = server
        self.engine = engine
        self.store = LeaseStore(engine)
        self.catalog = Catalog(engine, self.store, DataPaths(tmp_path / "data"))
        self.defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
        self.feed = write_feed(server, clip_files(server.root, 2))
        self.output = tmp_path / "out"
        self.raw = {
            "name": "follows",
            "output_dir": str(self.output),
            "inputs": {"listings": [self.feed], "refresh": {"cron": "0 * * * *"}},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(siglip, ["a shape"]),
            "dedup": {"threshold": 0.9999},
        }
        self.project = self.catalog.projects.register(parse_project_config(self.raw)).project
        self.instance = None

    def drive(self):
        result = drive_quietly(
            ["follows"], instance=self.instance, defs=self.defs, store=self.store
        )
        assert result.stages == {"follows": "complete"}, result
        return result

    def refresh(self) -> source_refresh.RefreshRequest:
        return source_refresh.request_refresh(self.store, self.project.id, "follows")

    def finished(self) -> dict[tuple[str, str], object]:
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text("SELECT stage, item_key, finished_at FROM dataminer.work_items")
            ).all()
        return {(r.stage, r.item_key): r.finished_at for r in rows}

    def fetched(self) -> list[str]:
        """The video files the server was asked for (GET requests), in order."""
        return [
            r.path for r in self.server.requests if r.path.endswith(".mp4") and r.method == "GET"
        ]


@pytest.fixture
def following(tmp_path, database_url, engine, http_server, tiny_siglip):
    following = Following(tmp_path, database_url, engine, http_server, tiny_siglip)
    with instance_for_test() as instance:
        following.instance = instance
        yield following


def test_a_refresh_takes_only_new_videos_and_one_with_nothing_new_does_no_work(following):
    following.drive()
    assert sorted(set(following.fetched())) == ["/clip0.mp4", "/clip1.mp4"]
    first = following.finished()

    # Nothing new: the feed is read again, no video is downloaded, no stage runs again.
    requests_before = len(following.server.requests)
    assert following.refresh().queued
    following.drive()
    after = following.finished()
    changed = {key for key, at in after.items() if first.get(key) != at}
    assert changed == {("catalog", "follows")}
    new_requests = following.server.requests[requests_before:]
    assert [r.path for r in new_requests] == ["/feed.xml"]

    # The feed grows by one clip: only that one is downloaded, and the dataset gains it.
    clip_files(following.server.root, 1, first=2)
    write_feed(following.server, ["clip0.mp4", "clip1.mp4", "clip2.mp4"])
    fetched_before = len(following.fetched())
    following.refresh()
    following.drive()
    assert following.fetched()[fetched_before:] == ["/clip2.mp4"] * len(
        following.fetched()[fetched_before:]
    )
    assert following.fetched()[fetched_before:]
    later = following.finished()
    redone = {key for key, at in later.items() if after.get(key) != at}
    assert {stage for stage, _ in redone} >= {"catalog", "download", "frames", "filter", "dedup"}
    assert not {key for key in redone if key[0] in ("download", "frames") and "clip2" not in key[1]}
    states = source_refresh.source_states(following.engine, following.project.id)
    assert [(s.source, s.videos_listed, s.videos_new) for s in states] == [
        (f"listing: {following.feed}", 3, 1)
    ]

    # The source's yield: in status, in the dataset's metadata and in its report.
    (feed_yield,) = source_yield(following.engine, following.project.id)
    kept = len(pd.read_parquet(following.output / "dataset" / "manifest.parquet"))
    assert feed_yield["source"] == f"listing: {following.feed}"
    assert (feed_yield["videos"], feed_yield["downloaded"]) == (3, 3)
    assert feed_yield["frames_extracted"] >= feed_yield["frames_passed"] >= kept > 0
    assert feed_yield["frames_kept"] == kept
    assert feed_yield["kept_per_minute"] == pytest.approx(kept / 0.1, rel=0.1)  # 3 x 2 s
    report = (following.output / "dataset" / "report.md").read_text()
    assert "## Yield per source" in report and f"| listing: {following.feed} | 3 | 3 |" in report
    assert feed_yield["kept_per_video"] == pytest.approx(kept / 3, rel=0.01)
    event = following.instance.get_latest_materialization_event(dg.AssetKey("dataset"))
    metadata = event.asset_materialization.metadata
    assert metadata["kept_per_download_minute"].value == pytest.approx(kept / 0.1, rel=0.1)
    (row,) = metadata["yield_per_source"].value.records
    assert row.data["source"] == f"listing: {following.feed}" and row.data["frames_kept"] == kept


def test_a_refresh_does_not_retry_videos_the_project_rejected(following):
    following.drive()
    with following.engine.begin() as c:  # clip0's download died (a host that refused it)
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'dead', last_error = 'refused'
                        WHERE stage = 'download' AND item_key LIKE 'clip0%'""")
        )
    following.refresh()
    following.drive()
    with following.engine.connect() as c:
        status = c.execute(
            sa.text("""SELECT status FROM dataminer.work_items
                        WHERE stage = 'download' AND item_key LIKE 'clip0%'""")
        ).scalar_one()
    assert status == "dead"


def test_a_failing_feed_is_recorded_and_waits_for_its_back_off(
    following, dataminer_env, monkeypatch, tmp_path
):
    monkeypatch.setenv("DATAMINER_DATA_DIR", str(tmp_path / "data"))  # the pipeline's
    following.drive()
    following.server.respond("/feed.xml", status=500)
    following.refresh()
    following.drive()  # the listing failed; the project is complete all the same
    (state,) = source_refresh.source_states(following.engine, following.project.id)
    assert state.failures == 1 and "500" in state.last_error
    assert state.retry_at > datetime.now(UTC) + timedelta(minutes=10)

    asked = sum(r.path == "/feed.xml" for r in following.server.requests)
    following.refresh()
    following.drive()
    assert sum(r.path == "/feed.xml" for r in following.server.requests) == asked  # waits

    with following.engine.begin() as c:  # its back-off is over; it fails again
        c.execute(sa.text("UPDATE dataminer.project_sources SET retry_at = now()"))
    following.refresh()
    following.drive()
    (state,) = source_refresh.source_states(following.engine, following.project.id)
    assert state.failures == 2
    assert state.retry_at > datetime.now(UTC) + timedelta(minutes=25)  # doubled

    from dataminer_dagster.cli import main

    out = CliRunner().invoke(main, ["status", "follows"]).output
    assert "FAILING (2 times in a row)" in out and "listing: " in out
    assert "refresh: cron '0 * * * *' (UTC)" in out

    out = CliRunner().invoke(main, ["refresh", "follows"]).output
    assert out == "refresh of follows: its catalog is queued to list the sources again\n"
    out = CliRunner().invoke(main, ["refresh", "follows"]).output
    assert "its listing is queued" in out
    result = CliRunner().invoke(main, ["refresh", "nobody"])
    assert result.exit_code != 0 and "no project named 'nobody'" in result.output


def test_a_refresh_while_the_listing_runs_is_merged_into_it(following):
    # registered, never listed: the catalog is queued, and a refresh adds nothing to it
    request = following.refresh()
    assert not request.queued and "queued" in request.reason


def test_the_sensor_asks_for_a_refresh_when_the_cron_is_due(following):
    from dataminer_dagster.definitions import defs as product_defs

    following.drive()
    sensor = product_defs.resolve_sensor_def("refresh_sources")
    db = following.defs.resources["db"]
    with dg.build_sensor_context(instance=following.instance, resources={"db": db}) as context:
        assert "no project's refresh is due" in str(sensor(context).skip_message)
        with following.engine.begin() as c:  # the last listing was before the hour's tick
            c.execute(
                sa.text("""UPDATE dataminer.work_items SET finished_at = now() - interval '2 hours'
                            WHERE stage = 'catalog'""")
            )
        assert "refresh queued: follows" in str(sensor(context).skip_message)
    with following.engine.connect() as c:
        assert (
            c.execute(
                sa.text("SELECT status FROM dataminer.work_items WHERE stage = 'catalog'")
            ).scalar_one()
            == "pending"
        )


def test_the_schedule_is_due_once_per_missed_tick():
    listed = datetime(2026, 12, 3, 10, 30, tzinfo=UTC)
    assert not refresh_due("0 * * * *", "UTC", listed, listed + timedelta(minutes=29))
    assert refresh_due("0 * * * *", "UTC", listed, listed + timedelta(minutes=30))
    assert refresh_due("0 * * * *", "UTC", listed, listed + timedelta(days=3))  # caught up once
    assert next_refresh("0 */6 * * *", "UTC", listed) == datetime(2026, 12, 3, 12, tzinfo=UTC)
    assert next_refresh("0 9 * * *", "Europe/Berlin", listed) == datetime(
        2026, 12, 4, 8, tzinfo=UTC
    )


def test_due_projects_wait_for_a_finished_listing(following):
    project = following.catalog.projects.get("follows")
    now = datetime.now(UTC)
    old = now - timedelta(hours=2)
    assert due_projects([project], {"follows": (1, "done", old)}, now) == [project]
    assert due_projects([project], {"follows": (1, "running", old)}, now) == []
    assert due_projects([project], {"follows": (1, "pending", None)}, now) == []


@pytest.mark.parametrize(
    ("refresh", "message"),
    [
        ({"cron": "every hour"}, "is not a cron string"),
        ({"cron": "0 * * * *", "timezone": "Mars/Base"}, "is not a time zone name"),
    ],
)
def test_a_bad_schedule_is_refused_at_validation(tmp_path, refresh, message):
    raw = {
        "name": "p",
        "output_dir": str(tmp_path),
        "inputs": {"listings": ["http://127.0.0.1/feed.xml"], "refresh": refresh},
        "filter": {"positive_prompts": ["a"]},
    }
    with pytest.raises((ConfigError, ValueError), match=message):
        parse_project_config(raw)


def test_keys_added_later_leave_fingerprints_as_they_were(tmp_path):
    raw = {
        "name": "p",
        "output_dir": str(tmp_path),
        "inputs": {"urls": ["http://127.0.0.1/a.mp4"]},
        "filter": {"positive_prompts": ["a"]},
    }
    view = parse_project_config(raw).inputs.results_view()
    assert "listings" not in view and "max_per_listing" not in view and "refresh" not in view
    scheduled = parse_project_config(
        raw | {"inputs": raw["inputs"] | {"refresh": {"cron": "0 * * * *"}}}
    )
    assert scheduled.fingerprints() == parse_project_config(raw).fingerprints()
    followed = parse_project_config(
        raw | {"inputs": raw["inputs"] | {"listings": ["http://127.0.0.1/feed.xml"]}}
    )
    assert followed.fingerprints()["catalog"] != parse_project_config(raw).fingerprints()["catalog"]


def test_a_youtube_channel_listing_gives_watch_urls_and_skips_nested_playlists():
    from dataminer_dagster.acquisition.ytdlp_search import parse_listing

    flat = {  # what yt-dlp's flat extraction of a channel's /videos tab returns
        "_type": "playlist",
        "entries": [
            {
                "_type": "url",
                "ie_key": "Youtube",
                "id": "dQw4w9WgXcQ",
                "url": "https://www.youtube.com/watch?v=dQw4w9WgXcQ",
                "title": "newest",
                "duration": 212,
            },
            {"_type": "playlist", "id": "UCshorts", "url": "https://www.youtube.com/@x/shorts"},
            {"_type": "url", "ie_key": "Youtube", "id": "dQw4w9WgXcQ", "url": "dup"},
            {"_type": "url", "ie_key": "Youtube", "id": "9bZkp7q19f0", "url": "9bZkp7q19f0"},
            {"_type": "url", "url": "not a url"},
        ],
    }
    hits = parse_listing(flat)
    assert [(h.video_id, h.url, h.duration) for h in hits] == [
        ("dQw4w9WgXcQ", "https://www.youtube.com/watch?v=dQw4w9WgXcQ", 212.0),
        ("9bZkp7q19f0", "https://www.youtube.com/watch?v=9bZkp7q19f0", None),
    ]


def test_refresh_wait_runs_the_refresh_in_this_process(
    following, dataminer_env, monkeypatch, tmp_path
):
    monkeypatch.setenv("DATAMINER_DATA_DIR", str(tmp_path / "data"))  # the pipeline's
    from dataminer_dagster.cli import main

    following.drive()
    before = following.finished()
    result = CliRunner().invoke(main, ["refresh", "follows", "--wait"])
    assert result.exit_code == 0, result.output
    assert "refresh of follows: its catalog is queued" in result.output
    assert "project follows: complete" in result.output
    after = following.finished()
    assert {k for k, at in after.items() if before.get(k) != at} == {("catalog", "follows")}


# -- a schedule per followed project (sensors/refresh_schedules.py) ------------------------------


def _product_definitions(followed):
    from dataminer_dagster.definitions import build_definitions

    return build_definitions(followed=followed)


def test_a_followed_project_has_a_schedule_that_queues_and_requests_its_catalog_run(following):
    from dataminer_dagster.db.project_records import followed_sources
    from dataminer_dagster.db.scheduling import REREQUEST_AFTER_S, requestable
    from dataminer_dagster.tags import RANGE_END, RANGE_START, REQUESTED_BY_TAG

    following.drive()
    followed = followed_sources(following.engine)
    assert {name: (r.cron, r.timezone) for name, r in followed.items()} == {
        "follows": ("0 * * * *", "UTC")
    }
    defs = _product_definitions(followed)
    schedule = defs.resolve_schedule_def("refresh_project_follows")
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("0 * * * *", "UTC")
    assert schedule.job_name == "catalog_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    db = following.defs.resources["db"]

    # The feed grows; the sensor leaves the project to its schedule, even when its cron is due.
    clip_files(following.server.root, 1, first=2)
    write_feed(following.server, ["clip0.mp4", "clip1.mp4", "clip2.mp4"])
    with following.engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET finished_at = now() - interval '2 hours'
                        WHERE stage = 'catalog'""")
        )
    sensor = defs.resolve_sensor_def("refresh_sources")
    with dg.build_sensor_context(instance=following.instance, resources={"db": db}) as context:
        assert "no project's refresh is due" in str(sensor(context).skip_message)

    # Its tick queues the catalog and requests its run, marked requested for the work sensor.
    with dg.build_schedule_context(instance=following.instance, resources={"db": db}) as context:
        (request,) = list(schedule.evaluate_tick(context).run_requests)
        assert request.job_name == "catalog_job"
        assert request.tags[REQUESTED_BY_TAG] == "schedule"
        assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("follows", "follows")
        assert requestable(following.engine, ["catalog"], 10, REREQUEST_AFTER_S) == []
        # A second tick while that listing waits is merged into it.
        again = schedule.evaluate_tick(context)
        assert not again.run_requests and "its listing is queued" in again.skip_message

    # The requested run lists the feed (a run of automation: it respects back-offs) and the
    # work that follows takes only the new clip.
    fetched_before = len(following.fetched())
    job = following.defs.resolve_job_def("catalog_job")
    assert job.execute_in_process(instance=following.instance, tags=request.tags).success
    following.drive()
    assert set(following.fetched()[fetched_before:]) == {"/clip2.mp4"}


def test_a_schedule_tick_keeps_to_the_lane_share_a_failed_listings_retry_and_its_own_cron(
    following,
):
    from dataminer_dagster.db.project_records import followed_sources
    from dataminer_dagster.db.scheduling import REREQUEST_AFTER_S, requestable
    from dataminer_dagster.lanes import LANES_BY_NAME
    from dataminer_dagster.tags import LANE_TAG

    following.drive()
    defs = _product_definitions(followed_sources(following.engine))
    schedule = defs.resolve_schedule_def("refresh_project_follows")
    db = following.defs.resources["db"]

    def tick():
        with dg.build_schedule_context(
            instance=following.instance, resources={"db": db}
        ) as context:
            return schedule.evaluate_tick(context)

    def catalog(status: str) -> None:
        with following.engine.begin() as c:
            c.execute(
                sa.text("UPDATE dataminer.work_items SET status = :s WHERE stage = 'catalog'"),
                {"s": status},
            )

    # A listing that failed waits for its retry and its back-off: the tick does not reset it.
    catalog("failed")
    skipped = tick()
    assert not skipped.run_requests and "waits for its retry" in skipped.skip_message

    # The catalog lane runs its share of runs: the listing is queued, the work sensor asks.
    catalog("done")
    share = LANES_BY_NAME["catalog"].policy.max_runs
    for _ in range(share):
        following.instance.create_run_for_job(
            following.defs.resolve_job_def("catalog_job"),
            tags={LANE_TAG: "catalog"},
            status=dg.DagsterRunStatus.STARTED,
        )
    full = tick()
    assert not full.run_requests and "the work sensor requests its run" in full.skip_message
    assert [r.key for r in requestable(following.engine, ["catalog"], 10, REREQUEST_AFTER_S)] == [
        "follows"
    ]

    # Its cron changed since the definitions loaded: the schedule skips, the sensor keeps it.
    catalog("done")
    changed = dict(
        following.raw, inputs={**following.raw["inputs"], "refresh": {"cron": "0 0 * * *"}}
    )
    following.catalog.projects.register(parse_project_config(changed))
    moved = tick()
    assert not moved.run_requests and "is now '0 0 * * *'" in moved.skip_message
    assert "refresh_sources" in moved.skip_message


def test_the_sensor_keeps_the_crons_no_loaded_schedule_has_unless_switched_off(following):
    from dataminer_dagster.assets.catalog.config import RefreshConfig
    from dataminer_dagster.sensors.refresh_schedules import left_to_sensor

    (row,) = following.catalog.projects.all()
    hourly = RefreshConfig(cron="0 * * * *")
    assert left_to_sensor([row], {"follows": hourly}, frozenset(), "") == []
    assert left_to_sensor([row], {}, frozenset(), "") == [row]  # not loaded yet
    other = {"follows": RefreshConfig(cron="0 0 * * *")}
    assert left_to_sensor([row], other, frozenset(), "") == [row]  # loaded with another cron
    off = frozenset({"refresh_project_follows"})
    assert left_to_sensor([row], {}, off, "") == []  # turned off in the UI: off for the sensor
    assert left_to_sensor([row], {}, frozenset({"dm_refresh_project_follows"}), "dm_") == []


def test_schedules_are_one_per_followed_project_and_named_for_dagster():
    from dataminer_dagster.assets.catalog.config import RefreshConfig
    from dataminer_dagster.definitions import build_definitions

    followed = {
        "b-roll": RefreshConfig(cron="*/5 * * * *", timezone="Europe/Berlin"),
        "b_roll": RefreshConfig(cron="0 0 * * *"),  # the same schedule name: the first has it
        "forklifts": RefreshConfig(cron="0 */6 * * *"),
    }
    defs = build_definitions(followed=followed)
    # A project named like a sensor (refresh_sources) loads beside it.
    build_definitions(followed={"sources": followed["forklifts"]}).get_repository_def()
    assert sorted((s.name, s.cron_schedule, s.execution_timezone) for s in defs.schedules) == [
        ("refresh_project_b_roll", "*/5 * * * *", "Europe/Berlin"),
        ("refresh_project_forklifts", "0 */6 * * *", "UTC"),
    ]
    assert not build_definitions(followed={}).schedules
    prefixed = build_definitions(prefix="dm", followed=followed)
    assert {s.name for s in prefixed.schedules} == {
        "dm_refresh_project_b_roll",
        "dm_refresh_project_forklifts",
    }
    assert {s.job_name for s in prefixed.schedules} == {"dm_catalog_job"}
    prefixed.get_repository_def()  # the location loads


def test_the_schedules_are_read_when_a_code_server_initialises_the_definitions(
    following, dataminer_env, caplog, monkeypatch, tmp_path
):
    from dagster._core.definitions.definitions_load_context import (
        DefinitionsLoadContext,
        DefinitionsLoadType,
    )

    from dataminer_dagster.sensors.refresh_schedules import followed_projects
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    assert followed_projects(settings) == {}  # imported by a script: no loader, no read
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)):
        assert set(followed_projects(settings)) == {"follows"}
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(DefinitionsLoadType.RECONSTRUCTION)):
        assert followed_projects(settings) == {}  # a run worker needs no schedule
    with DefinitionsLoadContext.scoped(DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)):
        unreachable = settings.model_copy(
            update={"database_url": "postgresql://postgres@127.0.0.1:1/none"}
        )
        assert followed_projects(unreachable) == {}
        assert "the refresh_sources sensor keeps their crons" in caplog.text
        # Loading starts no embedded database (`dg check defs` needs none) and reads nothing.
        monkeypatch.delenv("DATAMINER_DATABASE_URL")
        monkeypatch.setenv("DATAMINER_HOME", str(tmp_path / "idle"))
        idle = load_settings()
        assert idle.database_url is None
        assert followed_projects(idle) == {}
        assert not idle.embedded_pgdata.exists()
