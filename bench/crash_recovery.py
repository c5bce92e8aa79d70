"""How soon a project moves again after the daemon was killed with its runs and restarted.

Under a real `dagster-daemon run` on the repository's dagster.yaml, with the default leases
(heartbeat every 15 s, stale after 120 s) and the default reaper interval (15 s): the demo project
is added, the daemon's whole process group is SIGKILLed while a filter item is being worked on,
and the daemon is started again. Measured from that restart: when the dead run is failed in
Dagster, when the project is moving (any item begun or finished), when the killed filter item is
worked on again (it counted an attempt, so it waits for `retry.base_delay_s` first) and when the
project is complete.

Two ways in one command, on the same videos and models:
- `pid lookup` (the product): the reaper runs in the dead run's process space, finds its pid gone
  and ends it at once (core/process_liveness.py);
- `silence only` (the baseline, and what a run on another machine still gets): the dead run's
  heartbeat row is stripped of its process space right after the kill, so the reaper can only wait
  for the heartbeat to go stale.

A second scenario, where no run monitoring can help: `dataminer run` (no daemon) SIGKILLed while a
filter item is worked on, then run again; measured: how long the second command takes to finish
the project, and who failed the dead run.

    python bench/crash_recovery.py [--trials 2] [--scenario daemon|rerun|both]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.daemon import DaemonHome, demo_project  # noqa: E402

DEFAULTS = {  # the settings a user has without a settings file, spelled out
    "leases": {"heartbeat_s": 15, "stale_after_s": 120},
    "sensors": {"reaper_interval_s": 15},
}
WAIT_S = 600


def media(root: Path) -> tuple[list[str], Path, Path, object]:
    from dataminer_dagster.core.synthetic import write_scene_clips
    from dataminer_dagster.demo import serve_directory
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    write_scene_clips(root / "www", 6)
    siglip = build_tiny_siglip(root / "siglip")
    yolo = build_tiny_yolo(root / "yolo.pt")
    server = serve_directory(root / "www")
    base = server.__enter__()
    return [f"{base}/sample{i:02d}.mp4" for i in range(6)], siglip, yolo, server


def wait(home: DaemonHome, condition, what: str) -> None:
    home.wait_until(condition, WAIT_S, what, "alpha")


def forget_process_space(home: DaemonHome, run_id: str) -> None:
    """The baseline: the dead run's heartbeat as if sent from elsewhere (no process space)."""
    import sqlalchemy as sa

    with home.engine.begin() as c:
        c.execute(
            sa.text("UPDATE dataminer.run_heartbeats SET process_space = NULL WHERE run_id = :r"),
            {"r": run_id},
        )


def failed_by(instance, run_id: str) -> str:
    """Who failed the run: the lease reaper (and why), or Dagster's run monitoring."""
    from dagster._core.events import DagsterEventType

    [failure, *_] = [
        r.dagster_event.message or ""
        for r in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE)
    ]
    if failure.startswith("Failed by dataminer: its process is gone"):
        return "reaper: process gone"
    if failure.startswith("Failed by dataminer: no heartbeat"):
        return "reaper: silence"
    return f"Dagster: {failure[:60]}"


def trial(urls: list[str], siglip: Path, yolo: Path, *, pid_lookup: bool) -> dict[str, float]:
    home = DaemonHome(DEFAULTS)
    # This process reads the daemon's instance (its dagster.yaml names the embedded database).
    os.environ.update(DATAMINER_HOME=str(home.home), DAGSTER_HOME=str(home.dagster_home))
    try:
        home.start_daemon()
        home.add_project(demo_project("alpha", urls, siglip, yolo))
        row = home.wait_for_running_item("filter", WAIT_S, "alpha")
        home.kill_daemon_group()
        if not pid_lookup:
            forget_process_space(home, row.lease_owner)
        [(restarted_at,)] = home.query("SELECT now()")
        restarted = time.monotonic()
        home.start_daemon()

        def elapsed() -> float:
            return round(time.monotonic() - restarted, 1)

        figures: dict[str, float] = {}

        import dagster as dg

        instance = dg.DagsterInstance.from_config(str(home.dagster_home))

        def run_failed() -> bool:
            return instance.get_run_by_id(row.lease_owner).status == dg.DagsterRunStatus.FAILURE

        wait(home, run_failed, "the dead run failed")
        figures["dead run failed"] = elapsed()
        figures["failed by"] = failed_by(instance, row.lease_owner)
        wait(
            home,
            lambda: bool(
                home.query(
                    "SELECT 1 FROM dataminer.work_items WHERE started_at > :t OR finished_at > :t",
                    t=restarted_at,
                )
            ),
            "any item begun or finished after the restart",
        )
        figures["project moving"] = elapsed()
        wait(
            home,
            lambda: bool(
                home.query(
                    "SELECT 1 FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k "
                    "AND status = 'running' AND lease_owner <> :r",
                    k=row.item_key,
                    r=row.lease_owner,
                )
                or home.query(
                    "SELECT 1 FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k "
                    "AND status = 'done'",
                    k=row.item_key,
                )
            ),
            "the killed filter item worked on again",
        )
        figures["its item worked on again"] = elapsed()
        home.wait_for_stage("alpha", "complete", WAIT_S)
        figures["project complete"] = elapsed()
        instance.dispose()
        return figures
    finally:
        home.close()


def rerun_trial(urls: list[str], siglip: Path, yolo: Path, *, pid_lookup: bool) -> dict:
    """`dataminer run` (no daemon) SIGKILLed while a filter item is worked on, then run again:
    the seconds the second command takes to complete the project."""
    import subprocess

    import dagster as dg
    import yaml

    from tests.helpers.daemon import BIN, REPO_ROOT

    home = DaemonHome(DEFAULTS)
    os.environ.update(DATAMINER_HOME=str(home.home), DAGSTER_HOME=str(home.dagster_home))
    try:
        config = home.root / "alpha.yaml"
        config.write_text(yaml.safe_dump(demo_project("alpha", urls, siglip, yolo)))
        assert home.dataminer("db", "upgrade").returncode == 0
        first = subprocess.Popen(
            [str(BIN / "dataminer"), "run", str(config), "--no-progress"],
            cwd=REPO_ROOT,
            env=home.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        row = home.wait_for_running_item("filter", WAIT_S, "alpha")
        first.kill()
        first.wait(30)
        if not pid_lookup:
            forget_process_space(home, row.lease_owner)
        started = time.monotonic()
        again = home.dataminer("run", str(config), "--no-progress", timeout_s=WAIT_S)
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        figures = {"second run complete": round(time.monotonic() - started, 1)}
        instance = dg.DagsterInstance.from_config(str(home.dagster_home))
        figures["failed by"] = failed_by(instance, row.lease_owner)
        instance.dispose()
        return figures
    finally:
        home.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument(
        "--scenario",
        choices=["daemon", "rerun", "both"],
        default="both",
        help="daemon: the daemon's group killed and restarted; rerun: `dataminer run` killed "
        "and run again",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dm-crash-bench-"))
    urls, siglip, yolo, server = media(root)
    print(f"load average at the start: {os.getloadavg()}")
    scenarios = {"daemon": trial, "rerun": rerun_trial}
    chosen = list(scenarios) if args.scenario == "both" else [args.scenario]
    ways = ("pid lookup", "silence only")
    results: dict[tuple[str, str], list[dict]] = {(s, w): [] for s in chosen for w in ways}
    try:
        for _ in range(args.trials):
            for scenario, way in results:
                figures = scenarios[scenario](urls, siglip, yolo, pid_lookup=way == "pid lookup")
                results[scenario, way].append(figures)
                print(f"{scenario}, {way}: {figures}", flush=True)
    finally:
        server.__exit__(None, None, None)
    print(f"load average at the end: {os.getloadavg()}")
    for scenario in chosen:
        when = "after the daemon's restart" if scenario == "daemon" else "of the second command"
        print(f"\n{scenario}: seconds {when} (each trial)")
        keys = list(results[scenario, ways[0]][0])
        print("| way | " + " | ".join(keys) + " |")
        print("|---|" + "---|" * len(keys))
        for way in ways:
            trials = results[scenario, way]
            cells = [
                ", ".join(f"{t[k]:g}" if isinstance(t[k], float) else t[k] for t in trials)
                for k in keys
            ]
            print(f"| {way} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
