"""Dagster's own tools on the pipeline, used as a Dagster user uses them: a real `dagster-daemon
run` and `dagster-webserver` on the repository's dagster.yaml and workspace, and the webserver's
GraphQL calls that the UI makes (launch a backfill over all partitions or a subset, read the
Partitions tab's statuses, backfill the failed partitions).

* Every asset accepts a backfill (its cross-set dependencies say how partitions relate) and the
  backfill ends COMPLETED_SUCCESS once every item is done: a partition done by an earlier run is
  recorded as current. The dataset is the same afterwards.
* A dead item is a failed partition, with its reason in the run's failure; backfilling the failed
  partitions gives it fresh attempts.
* The run log holds no image data.
* A config change shows in Dagster: the partitions it made stale are stale on their page until
  the daemon has done them again.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster._core.events import DagsterEventType

from dataminer_dagster.acquisition.video_ids import video_id_for_url
from dataminer_dagster.demo import serve_directory, write_sample_videos
from tests.helpers.daemon import DaemonHome, demo_project
from tests.helpers.graphql import (
    launch_backfill,
    partition_statuses,
    stale_status,
    wait_for_backfill,
)
from tests.helpers.ui_demo import webserver

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("backfills"), pytest.mark.timeout(900)]

ASSETS = (
    "video_catalog",
    "downloads",
    "frames",
    "frames_backup",
    "filtered_frames",
    "deduped_set",
    "detections",
    "dataset",
)
COMPLETE_WITHIN_S = 300
BACKFILL_WITHIN_S = 300  # the backfill daemon works every 30 s


@pytest.fixture(scope="module")
def deployed():
    """A daemon and a webserver over a completed project `alpha` (3 clips, a local backup)."""
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    media = Path(tempfile.mkdtemp(prefix="dm-backfill-media-"))
    write_sample_videos(media / "www", 3)
    (media / "www" / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 500)
    siglip = build_tiny_siglip(media / "siglip")
    yolo = build_tiny_yolo(media / "yolo.pt")
    home = DaemonHome()
    with serve_directory(media / "www") as base, pytest.MonkeyPatch.context() as env:
        # This process reads the same instance and database as the daemon.
        env.setenv("DATAMINER_HOME", str(home.home))
        env.setenv("DAGSTER_HOME", str(home.dagster_home))
        env.delenv("DATAMINER_DATABASE_URL", raising=False)
        try:
            home.start_daemon()
            alpha = demo_project(
                "alpha", [f"{base}/sample{i:02d}.mp4" for i in range(3)], siglip, yolo
            )
            alpha["backup"] = {"dest": str(home.root / "backup")}
            home.add_project(alpha)
            home.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
            with webserver(home.env) as ui:
                yield home, ui, base, (siglip, yolo)
        finally:
            from dataminer_dagster.db.engine import dispose_engines

            dispose_engines()
            home.close()


def _instance(home: DaemonHome) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(home.dagster_home))


def _partitions(home: DaemonHome, asset: str) -> list[str]:
    from dataminer_dagster.engine.assembly import stage_assets

    (stage,) = [s for s in stage_assets().values() if s.name == asset]
    with _instance(home) as instance:
        return instance.get_dynamic_partitions(stage.partitions_def.name)


def _backfill_all(ui: str, backfills: dict[str, str]) -> dict[str, dict]:
    return {asset: wait_for_backfill(ui, i, BACKFILL_WITHIN_S) for asset, i in backfills.items()}


def test_a_backfill_of_every_asset_ends_successfully_changes_nothing_and_logs_no_image(
    deployed,
):
    home, ui, _, _ = deployed
    before = home.dataset("alpha")
    assert len(before) > 0

    everything = {asset: launch_backfill(ui, [asset]) for asset in ASSETS}
    finished = _backfill_all(ui, everything)
    assert {a: b["status"] for a, b in finished.items()} == dict.fromkeys(
        ASSETS, "COMPLETED_SUCCESS"
    ), finished

    subsets = {
        asset: launch_backfill(ui, [asset], _partitions(home, asset)[:1]) for asset in ASSETS
    }
    finished = _backfill_all(ui, subsets)
    assert {a: b["status"] for a, b in finished.items()} == dict.fromkeys(
        ASSETS, "COMPLETED_SUCCESS"
    ), finished

    pd.testing.assert_frame_equal(home.dataset("alpha"), before)
    for asset in ASSETS:
        statuses = partition_statuses(ui, asset)
        assert sorted(statuses["materializedPartitions"]) == sorted(_partitions(home, asset))
        assert statuses["failedPartitions"] == []

    # No run log holds image data (the filter's previews are files, not base64 in messages).
    with _instance(home) as instance:
        runs = instance.get_runs(dg.RunsFilter(job_name="filter_job"))
        assert runs
        messages = [e.message or "" for r in runs for e in instance.all_logs(r.run_id)]
    assert messages and not [m for m in messages if "base64" in m]

    # A config change, as the UI shows it: the partitions it made stale (detect's confidence:
    # the detections and the dataset, not the catalog nor dedup) until the daemon has redone them.
    project_assets = ("video_catalog", "deduped_set", "detections", "dataset")
    assert {a: stale_status(ui, a, "alpha")[0] for a in project_assets} == dict.fromkeys(
        project_assets, "FRESH"
    ), "recorded as current by the backfills, the partitions are fresh"
    alpha = yaml.safe_load((home.root / "alpha.yaml").read_text())
    home.add_project({**alpha, "detect": {**alpha["detect"], "confidence": 0.5}})
    seen = _wait_for(lambda: stale_status(ui, "detections", "alpha")[0] == "STALE", 60)
    assert seen, "the detections of alpha never showed stale"
    statuses = {a: stale_status(ui, a, "alpha") for a in project_assets}
    assert statuses["detections"][1] == ["detections_config[alpha]: has a new data version"]
    assert {a: s for a, (s, _) in statuses.items()} in (
        {
            "video_catalog": "FRESH",
            "deduped_set": "FRESH",
            "detections": "STALE",
            "dataset": "STALE",
        },
        # the daemon may have done the detections again between the two reads
        {
            "video_catalog": "FRESH",
            "deduped_set": "FRESH",
            "detections": "FRESH",
            "dataset": "STALE",
        },
    ), statuses
    home.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    assert _wait_for(
        lambda: (
            {a: stale_status(ui, a, "alpha")[0] for a in project_assets}
            == dict.fromkeys(project_assets, "FRESH")
        ),
        60,
    ), {a: stale_status(ui, a, "alpha") for a in project_assets}


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.3)
    return False


def _dead_item(home: DaemonHome, video_id: str) -> dict:
    (row,) = home.query(
        """SELECT status, attempts, last_error, finished_at FROM dataminer.work_items
            WHERE stage = 'download' AND item_key = :k""",
        k=video_id,
    )
    return row._asdict()


def test_a_dead_item_is_a_failed_partition_and_backfilling_it_tries_it_again(deployed):
    home, ui, base, (siglip, yolo) = deployed
    corrupt_url = f"{base}/corrupt.mp4"
    corrupt = video_id_for_url(corrupt_url)
    broken = demo_project("broken", [f"{base}/sample00.mp4", corrupt_url], siglip, yolo)
    home.add_project(broken)
    home.wait_for_stage("broken", "complete", COMPLETE_WITHIN_S)

    item = _dead_item(home, corrupt)
    assert item["status"] == "dead" and item["attempts"] == 1, item
    statuses = partition_statuses(ui, "downloads")
    assert statuses["failedPartitions"] == [corrupt], statuses
    # The reason is on the partition's failed run, where alerting and the run page look.
    with _instance(home) as instance:
        failed = [
            r
            for r in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
            if any(
                e.dagster_event.is_step_failure
                and corrupt in (e.dagster_event.message or "")
                or corrupt in str(e.dagster_event.event_specific_data)
                for e in instance.all_logs(r.run_id, of_type=DagsterEventType.STEP_FAILURE)
            )
        ]
    assert failed, "no failed run names the dead video"

    # The Partitions tab's "Backfill failed and missing partitions": fresh attempts.
    launched = time.time()
    finished = wait_for_backfill(
        ui, launch_backfill(ui, ["downloads"], statuses["failedPartitions"]), BACKFILL_WITHIN_S
    )
    again = _dead_item(home, corrupt)
    assert again["finished_at"].timestamp() > launched, "the dead item was not tried again"
    assert again["status"] == "dead" and again["attempts"] == 1, again  # still not a video
    assert finished["status"] == "COMPLETED_FAILED", finished
    assert partition_statuses(ui, "downloads")["failedPartitions"] == [corrupt]
