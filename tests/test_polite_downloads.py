"""Issue 14: downloads at YouTube scale. Fifty videos from a host that throttles like a video site
(an allowance per window answered with 429 and Retry-After, bot-check pages, expired stream
URLs, a stalled transfer), downloaded by three download runs at once, each in its own process, with
real yt-dlp, real Dagster and the real claim database.

What counts is the host's own log: no request reached it during a pause, at most two videos were
transferring at once, and every video arrived without an attempt spent on throttling. Then the
host closes for ten minutes: its item goes back until then, a video of another host still
downloads, and `dataminer status --json` names the paused host, until when and why.
"""

from __future__ import annotations

import json
import shutil

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dataminer_dagster.acquisition.video_ids import video_id_for_url
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.cli import main
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import projects_partitions, videos_partitions
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.registry import DOWNLOAD
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import materialize_partitions, resources, work_items
from tests.helpers.processes import run_batches_at_once
from tests.helpers.throttling_host import ThrottlingHost, write_videos

pytestmark = pytest.mark.slow

VIDEOS = 50
RUNS = 3
PER_HOST = 2
POLITE = {
    "timeout_s": 1,  # the stalled transfer times out fast
    "max_downloads_per_host": PER_HOST,
    "pause_base_s": 1,  # a bot check pauses the host 0.5-1 s (the host blocks for 0.4 s)
    "pause_max_s": 4,
    "max_pause_wait_s": 30,  # every pause of the host is waited out in the runs
    "sleep_interval_s": 0,
    "sleep_requests_s": 0,
}


def _register(catalog: Catalog, name: str, urls: list[str]):
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"urls": urls},
            "download": {"allow_private_networks": True, **POLITE},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    catalog.projects.register(config)


def test_fifty_videos_three_runs_one_polite_client(tmp_path, database_url, engine, dataminer_env):
    clip = write_opencv_video(
        tmp_path / "clip.mp4", SyntheticVideoSpec(width=64, height=48, fps=5, seconds=1.0)
    )
    root = tmp_path / "www"
    names = [f"v{n:02d}" for n in range(VIDEOS + 1)]  # v50 is for the end
    write_videos(root, names, clip)
    data_dir = dataminer_env / "data"  # the CLI reads it too
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
    res = resources(database_url, data_dir)

    with ThrottlingHost(
        root,
        allowance=6,
        window_s=2.0,
        bot_checks={"v07", "v31"},
        expiring={"v13", "v40"},
        stalling={"v21"},
        stall_s=2.5,
        body_s=0.15,
    ) as host:
        name = f"127.0.0.1:{host.port}"  # the host's throttle key
        urls = [host.page_url(n) for n in names[:VIDEOS]]
        ids = [video_id_for_url(u) for u in urls]
        _register(catalog, "polite", urls)
        with instance_for_test() as instance:
            materialize_partitions(
                [video_catalog],
                ["polite"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )

        batches = [ids[n::RUNS] for n in range(RUNS)]
        finished = run_batches_at_once(
            DOWNLOAD,
            videos_partitions.name,
            batches,
            database_url=database_url,
            data_dir=data_dir,
            work_dir=tmp_path,
            timeout_s=240,
        )

        assert all(f.result and f.result["success"] for f in finished), [
            f.output[-2000:] for f in finished
        ]
        items = work_items(engine, "download")
        assert {k: (r.status, r.attempts) for k, r in items.items()} == {
            k: ("done", 1) for k in ids
        }, "every video downloaded, none dead, no attempt spent on throttling"
        # The host's videos are one clip under fifty names: one video, the others copies of it
        # (their files deleted once downloaded and hashed).
        videos = catalog.videos.get(ids).values()
        (original,) = [v.video_id for v in videos if v.same_as is None]
        assert {v.same_as for v in videos} == {None, original}
        assert [p.stem for p in (data_dir / "videos").glob("*.mp4")] == [original]

        stats = host.stats
        assert stats.refused_windows >= 1 and stats.bot_pages == 2, "the host did throttle"
        assert (stats.expired, stats.stalled) == (2, 1)
        assert stats.requests_during_pause == 0, "no request was sent during a pause"
        assert stats.refused == stats.refused_windows, "one refusal per window: the first"
        assert stats.max_videos_at_once <= PER_HOST
        with engine.connect() as c:
            pauses = c.execute(
                sa.text("SELECT pauses FROM dataminer.host_pauses WHERE host = :h"),
                {"h": name},
            ).scalar_one()
        assert pauses >= stats.refused_windows + stats.bot_pages

        # The host closes for ten minutes; another host is fine.
        host.close_for(600)
        other_root = tmp_path / "other"
        other_root.mkdir()
        shutil.copyfile(clip, other_root / "w.mp4")
        with LocalHTTPServer(other_root) as other:
            later = [host.page_url("v50"), other.url("/w.mp4")]
            throttled, fine = (video_id_for_url(u) for u in later)
            _register(catalog, "later", later)
            with instance_for_test() as instance:
                materialize_partitions(
                    [video_catalog],
                    ["later"],
                    instance=instance,
                    resources=res,
                    partitions=projects_partitions,
                )
                result = materialize_partitions(
                    [downloads],
                    [throttled, fine],
                    instance=instance,
                    resources=res,
                    partitions=videos_partitions,
                )
                logs = [e.user_message for e in instance.all_logs(result.run_id)]

    items = work_items(engine, "download")
    assert items[fine].status == "done", "other hosts keep going"
    waiting = items[throttled]
    assert (waiting.status, waiting.attempts) == ("failed", 0), "given back, no attempt used"
    reason = "rate limited (HTTP 429, Retry-After 10m00s)"
    assert f"host {name} is paused until" in waiting.last_error
    assert reason in waiting.last_error
    with engine.connect() as c:
        until = c.execute(
            sa.text("SELECT paused_until FROM dataminer.host_pauses WHERE host = :h"),
            {"h": name},
        ).scalar_one()
    assert waiting.next_attempt_at == until, "tried again when the pause ends"

    observed = {
        e.event_specific_data.asset_observation.partition: (
            e.event_specific_data.asset_observation.metadata
        )
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }
    shown = [str(getattr(v, "value", v)) for v in observed[throttled].values()]
    assert "postponed" in shown, "the partition shows the item went back"
    assert any(reason in text and name in text for text in shown), "and which host, why"
    assert any(m.startswith(f"paused host {name} until ") and m.endswith(reason) for m in logs), (
        "the run's log says which host, until when and why"
    )

    status = CliRunner().invoke(main, ["status", "--json"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    [paused] = json.loads(status.output)["host_pauses"]
    assert paused["host"] == name
    assert paused["reason"] == reason and paused["until"] == until.isoformat()
    text = CliRunner().invoke(main, ["status"], catch_exceptions=False).output
    assert f"{name}: paused until" in text
