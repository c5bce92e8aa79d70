"""A host that trickles (512 bytes every 2 s, with a correct Content-Length, so that no read ever
times out) is given up on, and the rest of the batch is downloaded meanwhile; `dataminer run
--timeout` is kept inside a download. Real yt-dlp against a local server, real PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dataminer_dagster.acquisition.video_ids import video_id_for_url
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import projects_partitions, videos_partitions
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    drive_quietly,
    materialize_partitions,
    pipeline_definitions,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow

CLIP = SyntheticVideoSpec(width=160, height=120, fps=10, seconds=1.0)


@pytest.fixture
def hosts(tmp_path):
    """A slow clip (first in the catalog's order, so first in its batch) and a good one."""
    clips = write_videos(tmp_path / "www", {"slow.mp4": CLIP, "good.mp4": replace(CLIP, seed=1)})
    with LocalHTTPServer(tmp_path / "www") as server:
        server.trickle("/slow.mp4", bytes_per_step=512, every_s=2.0)
        yield server, clips


def _project(server: LocalHTTPServer, **download) -> tuple:
    names = ["slow.mp4", "good.mp4"]
    config = parse_project_config(
        {
            "name": "p1",
            "inputs": {"urls": [server.url(f"/{n}") for n in names]},
            "download": {"allow_private_networks": True, **download},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    return config, {name: video_id_for_url(server.url(f"/{name}")) for name in names}


def _slow_transfers(server: LocalHTTPServer) -> list[int]:
    return [r.bytes_sent for r in server.requests if r.path == "/slow.mp4"]


def test_a_trickling_host_is_given_up_within_the_speed_window_and_the_batch_goes_on(
    hosts, tmp_path, database_url, engine
):
    server, clips = hosts
    config, ids = _project(server, min_speed_kb_s=16, min_speed_window_s=4)
    data_dir = tmp_path / "data"
    Catalog(engine, LeaseStore(engine), DataPaths(data_dir)).projects.register(config)
    res = resources(database_url, data_dir)
    with instance_for_test() as instance:
        materialize_partitions(
            [video_catalog],
            ["p1"],
            instance=instance,
            resources=res,
            partitions=projects_partitions,
        )
        materialize_partitions(
            [downloads],
            [ids["slow.mp4"], ids["good.mp4"]],
            instance=instance,
            resources=res,
            partitions=videos_partitions,
        )
    items = work_items(engine, "download")
    slow = items[ids["slow.mp4"]]
    # A failed attempt, retried with back-off: a host slow now may not be at the next try, and
    # one that always is ends the item dead rather than keeping its project from completing.
    assert (slow.status, slow.attempts) == ("failed", 1)
    assert "too slow" in slow.last_error and "download.min_speed_kb_s" in slow.last_error
    assert max(_slow_transfers(server)) < clips["slow.mp4"].stat().st_size, "given up mid-way"
    assert items[ids["good.mp4"]].status == "done"
    assert not list((data_dir / "videos").glob(".*")), "no work directory left"


def test_the_commands_timeout_is_kept_inside_a_download_while_other_videos_download(
    hosts, tmp_path, database_url, engine
):
    server, clips = hosts
    # No minimum speed: only the command's deadline can end the slow download.
    config, ids = _project(server, min_speed_kb_s=0)
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    Catalog(engine, store, DataPaths(data_dir)).projects.register(config)
    defs = pipeline_definitions(resources(database_url, data_dir))
    with instance_for_test() as instance, pytest.raises(TimeoutError):
        drive_quietly(["p1"], instance=instance, defs=defs, store=store, timeout_s=30)
    items = work_items(engine, "download")
    slow = items[ids["slow.mp4"]]
    assert (slow.status, slow.attempts) == ("pending", 0), "given back, not an attempt"
    assert max(_slow_transfers(server)) < clips["slow.mp4"].stat().st_size, "given up mid-way"
    assert items[ids["good.mp4"]].status == "done", "the other video was downloaded meanwhile"
