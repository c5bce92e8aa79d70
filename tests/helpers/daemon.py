"""A real `dagster-daemon run` on the repository's dagster.yaml and workspace, as a user starts it.

`DaemonHome` is one deployment: a DATAMINER_HOME (embedded PostgreSQL, which also holds Dagster's
storage), a DAGSTER_HOME with a copy of the repository's dagster.yaml, and a settings file with
short leases so that crashes are noticed in seconds. The daemon runs in its own process group, as
a service manager would start it, so that a test can kill the whole group at once. Projects are
added with the real `dataminer` command, and waited for through the claim tables.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import sqlalchemy as sa
import yaml

from dataminer_dagster.hosting.supervisord import ServicesPaths

REPO_ROOT = Path(__file__).resolve().parents[2]
# How the daemon's log says a sensor's evaluation raised.
FAILED_SENSOR_TICK = "Sensor tick caught an error"
BIN = Path(sys.executable).parent

# Short enough that a killed run that has reported a heartbeat is noticed within seconds; the
# grace leaves a run worker time to start on a loaded 2-core machine (beside the suite, most of a
# minute).
FAST_RECOVERY = {
    # Stale after 10 s: short for the crash tests, long enough that a heartbeat thread starved
    # on a loaded 2-core machine does not look like a dead run.
    "leases": {"heartbeat_s": 0.5, "stale_after_s": 10},
    "runs": {"start_grace_s": 120, "queued_timeout_s": 600},
    "sensors": {"reaper_interval_s": 1},
}


def demo_project(name: str, urls: list[str], siglip: Path, yolo: Path) -> dict:
    """The demo-size project of bench/demo_daemon.py (permissive: tiny random models)."""
    return {
        "name": name,
        "inputs": {"urls": urls},
        "download": {"allow_private_networks": True},  # served on 127.0.0.1
        "extract": {"strategy": "time", "every_seconds": 1.0},
        "filter": {
            "model": str(siglip),
            "positive_prompts": ["shapes"],
            "positive_threshold": 0.0,
            "negative_threshold": 1.0,
            "pos_neg_margin": -1.0,
        },
        "dedup": {"threshold": 0.97},
        "detect": {"detector": "yolo", "model": str(yolo), "confidence": 0.001},
    }


def in_process_datasets(projects: list[dict]) -> dict[str, pd.DataFrame]:
    """The datasets an in-process `dataminer run` makes of the projects, in a home of its own:
    what a daemon's datasets are compared with."""
    home = DaemonHome()
    try:
        datasets = {}
        for project in projects:
            path = home.root / f"{project['name']}.yaml"
            path.write_text(yaml.safe_dump(project))
            run = home.dataminer("run", str(path), "--no-progress", timeout_s=600)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            datasets[project["name"]] = home.dataset(project["name"])
        return datasets
    finally:
        home.close()


class DaemonHome:
    def __init__(self, settings: dict | None = None):
        # Not under pytest's tmp dir, and short: the embedded server runs as its own system user
        # and keeps its socket in its data directory.
        self.root = Path(tempfile.mkdtemp(prefix="dm-daemon-"))
        self.home = self.root / "home"
        self.dagster_home = self.root / "dagster"
        self.home.mkdir()
        self.dagster_home.mkdir()
        shutil.copy(REPO_ROOT / "dagster.yaml", self.dagster_home / "dagster.yaml")
        (self.home / "settings.yaml").write_text(yaml.safe_dump(settings or FAST_RECOVERY))
        self.env = {
            **os.environ,
            "DATAMINER_HOME": str(self.home),
            "DAGSTER_HOME": str(self.dagster_home),
            "PYTHONUNBUFFERED": "1",
        }
        for inherited in ("DATAMINER_DATABASE_URL", "DATAMINER_DAGSTER_DATABASE_URL"):
            self.env.pop(inherited, None)
        self.daemon: subprocess.Popen | None = None
        self.log_path = self.root / "daemon.log"
        self._engine: sa.Engine | None = None

    # --- commands ----------------------------------------------------------------------------

    def dataminer(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "dataminer"), *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def add_project(self, config: dict) -> None:
        path = self.root / f"{config['name']}.yaml"
        path.write_text(yaml.safe_dump(config))
        added = self.dataminer("project", "add", str(path))
        assert added.returncode == 0, added.stdout + added.stderr

    # --- the daemon ---------------------------------------------------------------------------

    def start_daemon(
        self, backfill_interval_s: int | None = None, sensor_loop_s: float | None = None
    ) -> None:
        """`dagster-daemon run` on the repository's workspace. Two of Dagster's fixed pauses,
        which no setting reaches and which its loops read at each iteration, can be shortened so
        that a test waits seconds less at each step of the flow; nothing else changes:
        `backfill_interval_s`, the backfill daemon's pause between iterations (30 s,
        `DEFAULT_DAEMON_INTERVAL_SECONDS`: a backfill over the lanes takes an iteration per
        lane), and `sensor_loop_s`, the sensor daemon's shortest loop (5 s,
        `MIN_INTERVAL_LOOP_TIME`: the work sensor asks for 1 s and is evaluated every 5 s)."""
        shortened = {
            "dagster._daemon.controller": ("DEFAULT_DAEMON_INTERVAL_SECONDS", backfill_interval_s),
            "dagster._daemon.sensor": ("MIN_INTERVAL_LOOP_TIME", sensor_loop_s),
        }
        setting = [
            f"setattr(importlib.import_module({module!r}), {name!r}, {value!r})"
            for module, (name, value) in shortened.items()
            if value is not None
        ]
        command = [str(BIN / "dagster-daemon")]
        if setting:
            command = [
                sys.executable,
                "-c",
                "; ".join(
                    [
                        "import importlib, sys",
                        *setting,
                        "from dagster._daemon.cli import main",
                        "sys.argv[0] = 'dagster-daemon'",
                        "sys.exit(main())",
                    ]
                ),
            ]
        log = self.log_path.open("a")
        self.daemon = subprocess.Popen(
            [*command, "run", "-w", str(REPO_ROOT / "workspace.yaml")],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: code servers and run workers too
        )
        log.close()

    def kill_daemon_group(self) -> None:
        """What a power cut or an OOM kill of the service does: everything dies at once."""
        assert self.daemon is not None
        os.killpg(self.daemon.pid, signal.SIGKILL)
        self.daemon.wait(30)
        self.daemon = None

    def stop_daemon(self) -> None:
        if self.daemon is None:
            return
        with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.daemon.pid, signal.SIGTERM)
            self.daemon.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.daemon.pid, signal.SIGKILL)
        self.daemon = None

    def close(self) -> None:
        self.stop_daemon()
        if os.environ.get("DATAMINER_KEEP_DAEMON_LOG") and self.log_path.exists():
            shutil.copy(self.log_path, Path(os.environ["DATAMINER_KEEP_DAEMON_LOG"]))
        if self._engine is not None:
            self._engine.dispose()
        self.dataminer("db", "stop", timeout_s=60)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- what the claim tables say ------------------------------------------------------------

    @property
    def engine(self) -> sa.Engine:
        if self._engine is None:
            url = self.dataminer("db", "url").stdout.strip()
            from dataminer_dagster.db.server import with_driver

            self._engine = sa.create_engine(with_driver(url, "psycopg"), pool_pre_ping=True)
        return self._engine

    def query(self, statement: str, **params) -> list[sa.Row]:
        with self.engine.connect() as c:
            return c.execute(sa.text(statement), params).all()

    def project_stage(self, name: str) -> str | None:
        rows = self.query("SELECT stage FROM dataminer.projects WHERE name = :n", n=name)
        return rows[0].stage if rows else None

    def wait_until(
        self, condition: Callable[[], bool], timeout_s: float, what: str, project: str
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except sa.exc.OperationalError:  # the database is restarting
                pass
            time.sleep(0.1)
        raise AssertionError(f"{what} did not happen in {timeout_s:.0f} s\n{self.report(project)}")

    def wait_for_stage(self, project: str, stage: str, timeout_s: float) -> float:
        started = time.monotonic()
        self.wait_until(
            lambda: self.project_stage(project) == stage,
            timeout_s,
            f"project {project} reaching {stage}",
            project,
        )
        return time.monotonic() - started

    def running_item(self, stage: str) -> sa.Row | None:
        """A work item of `stage` that a run has begun, with that run's heartbeat pid."""
        rows = self.query(
            """SELECT w.item_key, w.lease_owner, h.pid FROM dataminer.work_items w
                 JOIN dataminer.run_heartbeats h ON h.run_id = w.lease_owner
                WHERE w.stage = :s AND w.status = 'running' AND w.started_at IS NOT NULL
                LIMIT 1""",
            s=stage,
        )
        return rows[0] if rows else None

    def wait_for_running_item(self, stage: str, timeout_s: float, project: str) -> sa.Row:
        """`running_item(stage)` once there is one (a run has begun an item of `stage`)."""
        found = {}

        def running() -> bool:
            found["row"] = self.running_item(stage)
            return found["row"] is not None

        self.wait_until(running, timeout_s, f"a {stage} item being processed", project)
        return found["row"]

    def report(self, project: str) -> str:
        status = self.dataminer("status", project, timeout_s=60)
        # The runs' lines, without the sensors' routine ticks that fill the tail of a long wait.
        routine = ("Checking for new runs for sensor", "skipped:", "MonitoringDaemon")
        # `dagster-daemon run` started here logs to log_path; under `dataminer services`,
        # supervisord keeps the daemon's log in the home (hosting/supervisord.py)
        services_log = ServicesPaths(self.home).log_dir / "dagster-daemon.log"
        log_path = self.log_path if self.log_path.exists() else services_log
        lines = log_path.read_text().splitlines() if log_path.exists() else ["(no log)"]
        log = "\n".join(line for line in lines if not any(r in line for r in routine))[-12000:]
        return f"--- dataminer status {project}:\n{status.stdout}{status.stderr}\n--- daemon log:\n{log}"

    def dataset(self, project: str) -> pd.DataFrame:
        data = json.loads(self.dataminer("status", project, "--json").stdout)
        return read_dataset(Path(data["output_dir"]))


def read_dataset(output_dir: Path) -> pd.DataFrame:
    """The comparable part of a project's dataset manifest, in a stable order."""
    manifest = pd.read_parquet(output_dir / "dataset" / "manifest.parquet")
    columns = ["file_name", "video_id", "frame_index", "timestamp", "group", "group_size"]
    return manifest[columns].sort_values("file_name").reset_index(drop=True)
