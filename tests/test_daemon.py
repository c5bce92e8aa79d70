"""The Dagster-native path under a real `dagster-daemon run`, as a user runs it: the repository's
dagster.yaml and workspace, the embedded PostgreSQL holding both the claim tables and Dagster's
storage, projects added with `dataminer project add`, sensors deciding everything.

Each project must end with the same dataset as an in-process `dataminer run` of it: undisturbed
(two projects, whose GPU steps never overlap), after a SIGKILL of a run worker mid-stage, after a
SIGKILL of the daemon's whole process group and a restart, and across a restart of the embedded
PostgreSQL. Every wait is bounded and fails with the project's status and the daemon's log.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml
from dagster._core.events import DagsterEventType

from dataminer_dagster.core.synthetic import write_scene_clips
from dataminer_dagster.demo import serve_directory
from dataminer_dagster.tags import LANE_TAG
from tests.helpers.daemon import (
    BIN,
    FAILED_SENSOR_TICK,
    FAST_RECOVERY,
    REPO_ROOT,
    DaemonHome,
    demo_project,
    in_process_datasets,
)
from tests.helpers.ports import unused_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("daemon"), pytest.mark.timeout(1500)]

# Small projects under a real daemon beside the rest of the suite on 2 cores, where their runs
# wait for the CPU; a hang still fails.
COMPLETE_WITHIN_S = 600
# The sensor daemon's loop (Dagster's is 5 s): the work sensor requests each lane's next run at
# its own 1 s. The services test runs Dagster's daemon unchanged.
SENSOR_LOOP_S = 1
# Leases that go stale only after 10 minutes, longer than a test waits for a project to complete:
# a killed run is then found dead because its process is gone, never by its silence.
SILENCE_NEVER_DECIDES = {**FAST_RECOVERY, "leases": {"heartbeat_s": 0.5, "stale_after_s": 600}}


@dataclass(frozen=True)
class Media:
    urls: list[str]
    siglip: Path
    yolo: Path
    www: Path  # the directory the URLs serve

    def project(self, name: str, videos: int = 6) -> dict:
        return demo_project(name, self.urls[:videos], self.siglip, self.yolo)


@pytest.fixture(scope="module")
def media():
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    root = Path(tempfile.mkdtemp(prefix="dm-media-"))
    write_scene_clips(root / "www", 6)
    siglip = build_tiny_siglip(root / "siglip")
    yolo = build_tiny_yolo(root / "yolo.pt")
    with serve_directory(root / "www") as base:
        yield Media([f"{base}/sample{i:02d}.mp4" for i in range(6)], siglip, yolo, root / "www")


@dataclass(frozen=True)
class Reference:
    """The datasets an in-process `dataminer run` makes of the projects, made in the background;
    reading one waits for them."""

    made: Future

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.made.result()[name]


@pytest.fixture(scope="module")
def reference(media) -> Iterator[Reference]:
    """Made in a home of its own while the module's first test starts its daemon and waits for
    its projects."""
    with ThreadPoolExecutor(1) as background:
        yield Reference(
            background.submit(
                in_process_datasets, [media.project("alpha", 6), media.project("beta", 4)]
            )
        )


@pytest.fixture
def deployment(monkeypatch, request):
    """A DATAMINER_HOME and DAGSTER_HOME for a daemon; `indirect` parametrization gives the
    settings file and the executor: (settings or None, executor or None)."""
    settings, executor = getattr(request, "param", (None, None))
    home = DaemonHome(settings)
    if executor:
        home.env["DATAMINER_EXECUTOR"] = executor
    # This process reads the same instance and database as the daemon.
    monkeypatch.setenv("DATAMINER_HOME", str(home.home))
    monkeypatch.setenv("DAGSTER_HOME", str(home.dagster_home))
    monkeypatch.delenv("DATAMINER_DATABASE_URL", raising=False)
    yield home
    from dataminer_dagster.db.engine import dispose_engines

    dispose_engines()
    home.close()


def running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def dagster_instance(home: DaemonHome) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(home.dagster_home))


def run_failure_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [
        r.dagster_event.message
        for r in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
    ]


def gpu_step_intervals(instance: dg.DagsterInstance) -> list[tuple[float, float, str]]:
    """(start, end, run id) of every step of the `gpu` pool (the filter and project lanes)."""
    intervals = []
    for job in ("filter_job", "project_job"):
        for run in instance.get_runs(dg.RunsFilter(job_name=job)):
            events = instance.all_logs(
                run.run_id,
                of_type={
                    DagsterEventType.STEP_START,
                    DagsterEventType.STEP_SUCCESS,
                    DagsterEventType.STEP_FAILURE,
                },
            )
            starts = [e.timestamp for e in events if e.dagster_event_type == "STEP_START"]
            ends = [e.timestamp for e in events if e.dagster_event_type != "STEP_START"]
            if starts:
                intervals.append((min(starts), max(ends) if ends else time.time(), run.run_id))
    return sorted(intervals)


def test_two_projects_complete_under_the_daemon_with_gpu_steps_one_at_a_time(
    deployment, media, reference
):
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    deployment.add_project(media.project("beta", 4))
    for name in ("alpha", "beta"):
        deployment.wait_for_stage(name, "complete", COMPLETE_WITHIN_S)
        pd.testing.assert_frame_equal(deployment.dataset(name), reference[name])

    instance = dagster_instance(deployment)
    intervals = gpu_step_intervals(instance)
    assert len(intervals) >= 3, "a filter run and two project runs"
    # A step's STEP_SUCCESS is logged just after its slot is freed (Dagster frees it as it
    # handles the event), so the next run's STEP_START may be logged a little earlier; two steps
    # that held the slot together would overlap by a whole step (seconds).
    logging_lag_s = 0.5
    for (_, end, first), (start, _, second) in zip(intervals, intervals[1:], strict=False):
        assert start >= end - logging_lag_s, f"gpu steps of runs {first} and {second} overlapped"
    judged_dead = [
        (run.run_id, message)
        for run in instance.get_runs()
        for message in run_failure_messages(instance, run.run_id)
        if "Failed by dataminer" in (message or "")
    ]
    assert not judged_dead, "an undisturbed run was judged dead (its slot freed while it ran)"
    log = deployment.log_path.read_text()
    assert FAILED_SENSOR_TICK not in log, log[-4000:]


def frozen_with_an_item_in_hand(deployment):
    """The row of a filter item of project alpha whose run worker is stopped (SIGSTOP) while the
    item is still in hand, however fast the machine works through the items."""
    while True:
        row = deployment.wait_for_running_item("filter", COMPLETE_WITHIN_S, "alpha")
        os.kill(row.pid, signal.SIGSTOP)
        if deployment.query(
            """SELECT 1 FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k
                  AND status = 'running' AND lease_owner = :owner""",
            k=row.item_key,
            owner=row.lease_owner,
        ):
            return row
        os.kill(row.pid, signal.SIGCONT)  # finished in between: the next one


def test_a_run_worker_killed_mid_stage_is_failed_and_its_work_done_again(
    deployment, media, reference
):
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    row = frozen_with_an_item_in_hand(deployment)
    run_id, pid = row.lease_owner, row.pid
    os.kill(pid, signal.SIGKILL)

    deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])
    # The code server that started the run saw its process die and failed the run (Dagster does
    # that while the code server lives; see the next test for when it does not); the reaper took
    # its leases back and did not fail it a second time.
    instance = dagster_instance(deployment)
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
    assert len(run_failure_messages(instance, run_id)) == 1


def test_a_run_cancelled_mid_stage_gives_its_items_back_without_counting_an_attempt(
    deployment, media, reference
):
    """As the UI's Terminate does: the run launcher interrupts the run worker, whose step ends
    with an item in hand. A person stopped the run; the item did nothing wrong."""
    instance = dagster_instance(deployment)
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    row = frozen_with_an_item_in_hand(deployment)
    with ThreadPoolExecutor(1) as pool:
        try:
            cancelled = pool.submit(instance.run_coordinator.cancel_run, row.lease_owner)
            deployment.wait_until(
                lambda: (
                    instance.get_run_by_id(row.lease_owner).status == dg.DagsterRunStatus.CANCELING
                ),
                60,
                "the run canceling",
                "alpha",
            )
            # The code server's termination event then waits for the frozen worker to take it
            # (multiprocessing's Event.set waits for its sleepers to wake): a moment for the
            # request to reach it, and the worker goes on.
            time.sleep(1)
        finally:
            os.kill(row.pid, signal.SIGCONT)
        assert cancelled.result(timeout=60)
    deployment.wait_until(
        lambda: instance.get_run_by_id(row.lease_owner).status == dg.DagsterRunStatus.CANCELED,
        60,
        "the run cancelled",
        "alpha",
    )

    deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])
    [item] = deployment.query(
        "SELECT attempts FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k",
        k=row.item_key,
    )
    assert item.attempts == 1, "only the attempt that finished it counts"


@pytest.mark.parametrize(
    "deployment",
    # The grace is longer than a run worker takes to start on a loaded 2-core machine and shorter
    # than the wait at the slot below.
    [({**FAST_RECOVERY, "runs": {"start_grace_s": 60, "queued_timeout_s": 600}}, "multiprocess")],
    indirect=True,
)
def test_a_multiprocess_run_waiting_for_the_gpu_slot_is_not_judged_dead(
    deployment, media, reference
):
    """Under the multiprocess executor a step's process (and its database resource) starts only
    once the step has its `gpu` slot; the run worker beats for the run while it waits."""
    instance = dagster_instance(deployment)
    instance.event_log_storage.set_concurrency_slots("gpu", 0)
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    found = {}

    def a_filter_run_started() -> bool:
        runs = instance.get_runs(
            dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={LANE_TAG: "filter"})
        )
        found["run"] = runs[0] if runs else None
        return bool(runs)

    deployment.wait_until(a_filter_run_started, COMPLETE_WITHIN_S, "a filter run", "alpha")
    time.sleep(80)  # beyond the grace; the reaper ticks every second
    waiting = instance.get_run_by_id(found["run"].run_id)
    assert waiting.status == dg.DagsterRunStatus.STARTED, run_failure_messages(
        instance, waiting.run_id
    )

    instance.event_log_storage.set_concurrency_slots("gpu", 1)
    deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])


@pytest.mark.parametrize("deployment", [(SILENCE_NEVER_DECIDES, None)], indirect=True)
def test_the_daemon_killed_with_its_runs_then_restarted_finishes_the_project(
    deployment, media, reference
):
    """The dead run's process was on this machine: the restarted daemon's reaper finds it gone
    and takes its work back at once, without waiting for its heartbeat to go stale."""
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    row = frozen_with_an_item_in_hand(deployment)
    deployment.kill_daemon_group()
    deadline = time.monotonic() + 10
    while running(row.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(row.pid), "the run worker died with the daemon's group"

    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])
    instance = dagster_instance(deployment)
    zombie = row.lease_owner
    assert instance.get_run_by_id(zombie).status == dg.DagsterRunStatus.FAILURE, (
        "not left STARTED for ever"
    )
    [message] = run_failure_messages(instance, zombie)
    assert message.startswith("Failed by dataminer: its process is gone (pid"), message


@pytest.mark.parametrize("deployment", [(SILENCE_NEVER_DECIDES, None)], indirect=True)
def test_dataminer_run_killed_mid_stage_then_run_again_finishes_the_project(
    deployment, media, reference
):
    """`dataminer run` with DAGSTER_HOME set and no daemon: its run, killed while it held the
    `gpu` slot, would stay STARTED in Dagster for ever, its slot with it, and the next command's
    filter step would wait for that slot."""
    import subprocess

    config = deployment.root / "alpha.yaml"
    config.write_text(yaml.safe_dump(media.project("alpha", 6)))
    assert deployment.dataminer("db", "upgrade").returncode == 0  # the tables to watch
    command = [str(BIN / "dataminer"), "run", str(config), "--no-progress"]
    first = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=deployment.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        row = frozen_with_an_item_in_hand(deployment)
        assert row.pid == first.pid
    finally:
        first.kill()
        first.wait(30)

    again = deployment.dataminer(
        "run", str(config), "--no-progress", "--timeout", "240", timeout_s=300
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])
    instance = dagster_instance(deployment)
    [message] = run_failure_messages(instance, row.lease_owner)
    assert message.startswith("Failed by dataminer: its process is gone (pid"), message


def test_the_embedded_postgresql_restarted_mid_project(deployment, media, reference):
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.add_project(media.project("alpha", 6))
    deployment.wait_until(
        lambda: deployment.running_item("download") or deployment.running_item("frames"),
        COMPLETE_WITHIN_S,
        "the video lane at work",
        "alpha",
    )
    stopped = deployment.dataminer("db", "stop")
    assert "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    time.sleep(2)
    assert deployment.dataminer("db", "url").returncode == 0  # starts it again

    deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
    pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])


def test_dataminer_services_run_projects_and_restart(deployment, media, reference):
    """The way `docs/deployment.md` runs it: supervisord with the webserver and the daemon.
    A restart stops both and the project's runs with them; the project still completes."""
    port = unused_port()
    setup = deployment.dataminer(
        "services", "setup", "--port", str(port), "--project-dir", str(REPO_ROOT)
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    started = deployment.dataminer("services", "start", "--timeout", "120", timeout_s=300)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        deployment.add_project(media.project("alpha", 6))
        deployment.wait_until(
            lambda: (
                deployment.running_item("filter") is not None
                or deployment.project_stage("alpha") == "complete"
            ),
            COMPLETE_WITHIN_S,
            "the filter at work",
            "alpha",
        )
        restarted = deployment.dataminer("services", "restart", "--timeout", "120", timeout_s=300)
        assert restarted.returncode == 0, restarted.stdout + restarted.stderr
        assert "dagster-daemon" in restarted.stdout and "RUNNING" in restarted.stdout
        deployment.wait_for_stage("alpha", "complete", COMPLETE_WITHIN_S)
        pd.testing.assert_frame_equal(deployment.dataset("alpha"), reference["alpha"])
    finally:
        deployment.dataminer("services", "stop", timeout_s=300)


def write_feed(media: Media, count: int) -> str:
    """An RSS feed beside the sample videos listing the first `count`, newest first."""
    items = "".join(
        f"<item><title>sample {i}</title><link>{media.urls[i]}</link></item>"
        for i in reversed(range(count))
    )
    (media.www / "feed.xml").write_text(
        '<?xml version="1.0" encoding="UTF-8"?><rss version="2.0"><channel><title>samples'
        f"</title><link>{media.urls[0]}</link><description>d</description>{items}</channel></rss>"
    )
    return media.urls[0].rsplit("/", 1)[0] + "/feed.xml"


@pytest.mark.parametrize(
    "deployment",
    [({**FAST_RECOVERY, "sensors": {"reaper_interval_s": 1, "refresh_interval_s": 1}}, None)],
    indirect=True,
)
def test_a_scheduled_refresh_takes_only_the_new_videos_under_the_daemon(deployment, media):
    feed = write_feed(media, 2)
    project = media.project("follows")
    project["inputs"] = {"listings": [feed], "refresh": {"cron": "* * * * *"}}
    deployment.add_project(project)
    deployment.start_daemon(sensor_loop_s=SENSOR_LOOP_S)
    deployment.wait_for_stage("follows", "complete", COMPLETE_WITHIN_S)
    first = deployment.dataset("follows")
    downloads = {
        r.item_key: r.finished_at
        for r in deployment.query(
            "SELECT item_key, finished_at FROM dataminer.work_items WHERE stage = 'download'"
        )
    }
    assert len(downloads) == 2

    write_feed(media, 3)  # a new upload; the next tick of the cron lists the feed again

    def has_grown() -> bool:
        members = deployment.query(
            """SELECT count(*) AS n FROM dataminer.project_videos pv
                 JOIN dataminer.projects p ON p.id = pv.project_id AND p.name = 'follows'"""
        )[0].n
        return (
            members == 3
            and deployment.project_stage("follows") == "complete"
            and (
                deployment.query(
                    """SELECT count(*) AS n FROM dataminer.work_items
                    WHERE stage IN ('dataset', 'download') AND status = 'done'"""
                )[0].n
                == 4
            )
        )

    deployment.wait_until(has_grown, 2 * COMPLETE_WITHIN_S, "the refresh's new video", "follows")
    # The project's own schedule asked for it (Dagster's run tags, in the same database).
    by_schedule = deployment.query(
        """SELECT count(*) AS n FROM run_tags
            WHERE key = 'dataminer/requested_by' AND value = 'schedule'"""
    )[0].n
    assert by_schedule >= 1, "the refresh_project_follows schedule requested no catalog run"
    after = {
        r.item_key: r.finished_at
        for r in deployment.query(
            "SELECT item_key, finished_at FROM dataminer.work_items WHERE stage = 'download'"
        )
    }
    assert {
        k: after[k] for k in downloads
    } == downloads  # the earlier videos were not fetched again
    second = deployment.dataset("follows")
    assert set(first["file_name"]) <= set(second["file_name"])  # the kept frames stay kept
    assert len(second) > len(first)
    versions = deployment.dataminer("dataset", "versions", "follows")
    assert versions.returncode == 0 and "v2" in versions.stdout, versions.stdout
