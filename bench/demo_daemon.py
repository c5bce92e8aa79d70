"""The demo-size project under a real `dagster-daemon run`, from `dataminer project add` to
complete: the sensor path a deployment takes, on the repository's dagster.yaml and workspace.

Each trial is a fresh deployment (tests/helpers/daemon.py: an embedded PostgreSQL, a DAGSTER_HOME
with the repository's dagster.yaml, the settings a user has without a settings file): the daemon
is started, the six sample videos served over HTTP on 127.0.0.1 and the tiny random-weight models
built (bench/crash_recovery.py, `media`), the project added with the real command, and the time
taken until the claim tables say it is complete; then the sensor ticks that failed, from the
daemon's log.

    python bench/demo_daemon.py [--trials 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

# bench/crash_recovery.py (which puts the repository on the path for tests.helpers)
from crash_recovery import DEFAULTS, WAIT_S, media

from tests.helpers.daemon import FAILED_SENSOR_TICK, DaemonHome, demo_project


def trial(
    urls: list[str], siglip: Path, yolo: Path, settings: dict = DEFAULTS
) -> tuple[float, int]:
    """(seconds from `project add` to complete, failed sensor ticks) of one fresh deployment
    with these settings (the settings file's sections)."""
    home = DaemonHome(settings)
    os.environ.update(DATAMINER_HOME=str(home.home), DAGSTER_HOME=str(home.dagster_home))
    try:
        assert home.dataminer("db", "upgrade").returncode == 0
        home.start_daemon()
        time.sleep(3)  # the daemon's own start is not the project's
        started = time.monotonic()
        home.add_project(demo_project("demo", urls, siglip, yolo))
        home.wait_for_stage("demo", "complete", WAIT_S)
        elapsed = time.monotonic() - started
        return elapsed, home.log_path.read_text().count(FAILED_SENSOR_TICK)
    finally:
        home.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="dm-demo-daemon-") as root:
        urls, siglip, yolo, server = media(Path(root))
        try:
            for n in range(1, args.trials + 1):
                seconds, failed = trial(urls, siglip, yolo)
                print(f"trial {n}: complete in {seconds:.1f} s, {failed} failed sensor ticks")
        finally:
            server.__exit__(None, None, None)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
