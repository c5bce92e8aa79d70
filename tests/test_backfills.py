"""Dagster's own tools on the pipeline, used as a Dagster user uses them: a real `dagster-daemon
run` and `dagster-webserver` on the repository's dagster.yaml and workspace, and the webserver's
GraphQL calls that the UI makes (launch a backfill over all partitions or a subset, read the
Partitions tab's statuses, backfill the failed partitions).

* Every asset accepts a backfill (its cross-set dependencies say how partitions relate), and so
  does the whole graph at once (all eight assets, all partitions: the UI's "Materialize all"); each
  ends COMPLETED_SUCCESS once every item is done: a partition done by an earlier run is recorded
  as current, one with nothing to do (the backup of a video no project backs up) as done. The
  datasets are those of an in-process `dataminer run` afterwards, and no run logs that a step
  "did not yield or return expected outputs".
* A dead item is a failed partition, with its reason in the run's failure; backfilling the failed
  partitions gives it fresh attempts.
* The run log holds no image data.
* A config change shows in Dagster: the partitions it made stale are stale on their page until
  the daemon has done them again.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster._core.events import DagsterEventType

from dataminer_dagster.acquisition.video_ids import video_id_for_url
from dataminer_dagster.core.synthetic import write_scene_clips
from dataminer_dagster.demo import serve_directory
from tests.helpers.daemon import DaemonHome, demo_project, in_process_datasets
from tests.helpers.graphql import (
    launch_backfill,
    partition_statuses,
    stale_status,
    wait_for_backfill,
)
from tests.helpers.ui_demo import webserver

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("backfills"), pytest.mark.timeout(1500)]

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
# Two small projects under a real daemon beside the rest of the suite on 2 cores, where their runs
# wait for the CPU; a hang still fails.
COMPLETE_WITHIN_S = 600
# The backfill daemon's pause between iterations (Dagster's is 30 s): a backfill of the whole
# graph takes an iteration for each lane of the flow, one after another.
BACKFILL_INTERVAL_S = 3
BACKFILL_WITHIN_S = 300
GRAPH_BACKFILL_WITHIN_S = 600


def _projects(base: str, siglip: Path, yolo: Path, backup: Path) -> list[dict]:
    """`alpha` (3 clips, a local backup) and `beta` (one clip of alpha's and one of its own, no
    backup: its own clip's frames_backup partition has nothing to do)."""
    alpha = demo_project("alpha", [f"{base}/sample{i:02d}.mp4" for i in range(3)], siglip, yolo)
    beta = demo_project("beta", [f"{base}/sample{i:02d}.mp4" for i in (2, 3)], siglip, yolo)
    return [{**alpha, "backup": {"dest": str(backup)}}, beta]


@pytest.fixture(scope="module")
def deployed():
    """A daemon and a webserver over the completed projects of `_projects`, and the datasets an
    in-process run makes of them (made meanwhile, in a home of their own)."""
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    media = Path(tempfile.mkdtemp(prefix="dm-backfill-media-"))
    write_scene_clips(media / "www", 4)
    (media / "www" / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"not a video" * 500)
    siglip = build_tiny_siglip(media / "siglip")
    yolo = build_tiny_yolo(media / "yolo.pt")
    home = DaemonHome()
    with (
        serve_directory(media / "www") as base,
        pytest.MonkeyPatch.context() as env,
        ThreadPoolExecutor(1) as reference,
    ):
        # This process reads the same instance and database as the daemon.
        env.setenv("DATAMINER_HOME", str(home.home))
        env.setenv("DAGSTER_HOME", str(home.dagster_home))
        env.delenv("DATAMINER_DATABASE_URL", raising=False)
        try:
            home.start_daemon(backfill_interval_s=BACKFILL_INTERVAL_S)
            projects = _projects(base, siglip, yolo, home.root / "backup")
            for project in projects:
                home.add_project(project)
            in_process = reference.submit(
                in_process_datasets, _projects(base, siglip, yolo, media / "backup")
            )
            for project in projects:
                home.wait_for_stage(project["name"], "complete", COMPLETE_WITHIN_S)
            with webserver(home.env) as ui:
                yield home, ui, base, (siglip, yolo), in_process.result()
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


def test_every_backfill_of_an_asset_or_of_the_whole_graph_succeeds_and_changes_nothing(
    deployed,
):
    home, ui, base, _, in_process = deployed
    for project, dataset in in_process.items():
        assert len(dataset) > 0
        pd.testing.assert_frame_equal(home.dataset(project), dataset)
    without_backup = video_id_for_url(f"{base}/sample03.mp4")  # beta's own clip
    assert without_backup in _partitions(home, "frames_backup")
    assert not home.query(
        "SELECT 1 FROM dataminer.work_items WHERE stage = 'backup' AND item_key = :k",
        k=without_backup,
    ), "the backup of a video no project backs up has no work item: nothing to do"

    # Each asset over all its partitions and over its first, and the whole graph over every
    # partition (the UI's "Materialize all"), launched at once: a backfill counts its own runs'
    # materializations, and with every item done no two runs compete for one (a done item is
    # recorded as current without a claim).
    launched = {
        **{(asset, "all"): launch_backfill(ui, [asset]) for asset in ASSETS},
        **{
            (asset, "first"): launch_backfill(ui, [asset], _partitions(home, asset)[:1])
            for asset in ASSETS
        },
        ("whole graph", "all"): launch_backfill(ui, list(ASSETS)),
    }
    finished = {
        target: wait_for_backfill(ui, backfill, GRAPH_BACKFILL_WITHIN_S)
        for target, backfill in launched.items()
    }
    assert {t: b["status"] for t, b in finished.items()} == dict.fromkeys(
        launched, "COMPLETED_SUCCESS"
    ), finished

    for project, dataset in in_process.items():
        pd.testing.assert_frame_equal(home.dataset(project), dataset)
    for asset in ASSETS:
        statuses = partition_statuses(ui, asset)
        assert sorted(statuses["materializedPartitions"]) == sorted(_partitions(home, asset))
        assert statuses["failedPartitions"] == []

    with _instance(home) as instance:
        runs = instance.get_runs()
        messages = {r.run_id: [e.message or "" for e in instance.all_logs(r.run_id)] for r in runs}
        filter_runs = instance.get_runs(dg.RunsFilter(job_name="filter_job"))
    # No run log holds image data (the filter's previews are files, not base64 in messages).
    assert filter_runs and not [m for r in filter_runs for m in messages[r.run_id] if "base64" in m]
    # No run says that a step left out outputs (a check's, where it checked several partitions).
    left_out = {r: [m for m in ms if "expected outputs" in m] for r, ms in messages.items()}
    assert len(runs) > len(ASSETS) and not any(left_out.values()), left_out

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
    home, ui, base, (siglip, yolo), _ = deployed
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
