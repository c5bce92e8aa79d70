"""Simulated machines for fault schedules: worker machines in network namespaces, a scratch
PostgreSQL they reach over veth pairs, and a nemesis that breaks things on a timetable.

    with FaultLab(workers=2, clips=3) as lab:
        outcome = lab.run(Schedule((Fault("db_stop_fast", at_s=2, lasts_s=5),)))
        assert not outcome.problems()

One `FaultLab` is one simulated data centre, built once and used for many schedules: a worker
machine per worker (a network namespace joined by a veth pair), a scratch PostgreSQL 15 cluster and
an HTTP server of synthetic clips (`demo.serve_directory`) on the lab's service address
(tests/helpers/fault_machines.py), the project's tiny models (models/tiny*.py) and a migrated
template database.

`run(schedule)` is one trial: a fresh database cloned from the template, a fresh data disk (a tmpfs,
so that it can be filled), the project registered, then each worker started as a real
`dataminer run` in its namespace and in its own pid namespace (`unshare --pid --fork --mount-proc`,
so that its /proc is its own and no other machine can look its pid up), with short leases. The
schedule's clock starts when the first item is begun; the nemesis injects each fault at its time and
heals it after its duration, while the workers are supervised as a service manager would: one that
exits on its own is started again a second later (and the exit is recorded: a fault should not end a
worker), one that the nemesis killed is started again when the fault ends. The trial ends when the
project is finished and no worker is left running; `fault_checks.check` then compares what the
database and the disk say with each other and with the clean run's. Everything the trial made
(processes, the filled disk, a partition, a stopped server, the database) is undone whatever
happens; `FaultLab.close` removes the namespaces, the addresses and the cluster.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
import yaml

from dataminer_dagster.db.project_flow import COMPLETE, PROJECT_FAILED
from tests.helpers.daemon import demo_project
from tests.helpers.fault_machines import (
    BIN,
    REPO_ROOT,
    Network,
    ScratchCluster,
    Worker,
    missing_requirements,
    run_command,
)
from tests.helpers.small_disk import fill, filler_of

CLOCK_OFFSET_DIR = Path(__file__).resolve().parent / "clock_offset"
PROJECT = "faults"
FINISHED_STAGES = (COMPLETE, PROJECT_FAILED)
# Short leases so that a schedule takes seconds: a run silent for 3 s loses its leases.
SETTINGS = {
    "leases": {"heartbeat_s": 0.3, "stale_after_s": 3.0},
    "runs": {"start_grace_s": 60},
    "retry": {"base_delay_s": 0.2, "max_delay_s": 2.0},
}
STALE_AFTER_S = SETTINGS["leases"]["stale_after_s"]

# Faults of the database or of a worker's surroundings, which must cost no attempt: a schedule made
# only of these must end with every item tried as often as in the clean run. A partition or a kill
# is a worker's own failure, after which its items may be tried again.
NO_COST_KINDS = (
    "db_stop_fast",
    "db_stop_immediate",
    "commit_cut",
    "clock_offset",
    "disk_full",
    "db_disk_full",
)
WORKER_KINDS = ("partition", "sigkill")
KINDS = (*WORKER_KINDS, *NO_COST_KINDS)
ONE_MACHINE_KINDS = (*WORKER_KINDS, "commit_cut", "clock_offset")
# How long the nemesis waits for a worker's COMMIT to cut; every commit of every worker waits
# meanwhile, so the window stays well under a lease's life.
COMMIT_WINDOW_S = 1.0
# How long each kind of fault lasts in a random schedule, (shortest, longest) in seconds: outages
# and partitions up to three leases' lives, so that some outlast a lease and some do not.
DURATIONS_S = {
    "partition": (0.5, 3 * STALE_AFTER_S),
    "sigkill": (0.5, 2 * STALE_AFTER_S),
    "db_stop_fast": (0.5, 3 * STALE_AFTER_S),
    "db_stop_immediate": (0.5, 3 * STALE_AFTER_S),
    "commit_cut": (COMMIT_WINDOW_S, COMMIT_WINDOW_S),
    "clock_offset": (1.0, 20.0),
    "disk_full": (0.5, 2 * STALE_AFTER_S),
    "db_disk_full": (0.5, 2 * STALE_AFTER_S),
}
RESTART_AFTER_S = 1.0
# How soon an action that was not possible yet (starting a database whose disk is full) is tried
# again.
RETRY_S = 0.5
# An injection or a healing; one that returns False was not possible yet.
Action = Callable[[], bool | None]
MAX_RESTARTS = 8
FILES_DISK_MB = 96


@dataclass(frozen=True)
class Fault:
    """One fault: `kind` (KINDS), when (seconds after the first item was begun) and for how long;
    `worker` for the kinds that hit one machine; `offset_s`: how far a clock is stepped."""

    kind: str
    at_s: float = 0.0
    lasts_s: float = 0.0
    worker: int = 0
    offset_s: float = 0.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {', '.join(KINDS)}")

    def describe(self) -> str:
        who = f" worker {self.worker}" if self.kind in ONE_MACHINE_KINDS else ""
        offset = f" {self.offset_s:+.0f} s" if self.kind == "clock_offset" else ""
        return f"{self.kind}{who}{offset} at {self.at_s:.1f} s for {self.lasts_s:.1f} s"


@dataclass(frozen=True)
class Schedule:
    faults: tuple[Fault, ...] = ()
    workers: int = 2

    @property
    def no_cost(self) -> bool:
        """Made only of faults that must cost no attempt."""
        return all(f.kind in NO_COST_KINDS for f in self.faults)

    def describe(self) -> str:
        return "; ".join(f.describe() for f in self.faults) or "no fault"


def random_schedule(rng: random.Random, *, workers: int, span_s: float) -> Schedule:
    """One to three faults at random times within `span_s` (the clean run's length from its first
    item); half the schedules are made only of faults that must cost no attempt."""
    kinds = NO_COST_KINDS if rng.random() < 0.5 else KINDS
    faults = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(kinds)
        worker = rng.randrange(workers)
        lasts = rng.uniform(*DURATIONS_S[kind])
        offset = rng.choice((-1, 1)) * rng.uniform(60, 600) if kind == "clock_offset" else 0.0
        at = rng.uniform(0, span_s)
        faults.append(Fault(kind, round(at, 1), round(lasts, 1), worker, round(offset)))
    return Schedule(tuple(sorted(faults, key=lambda f: f.at_s)), workers)


@dataclass
class Trial:
    """One schedule being played: where its files are and what happened."""

    schedule: Schedule
    root: Path
    database: str
    url: str
    data_dir: Path
    output_dir: Path
    workers: list[Worker] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    work_seconds: float = 0.0  # from the first item begun to the end
    finished: bool = False  # no worker left and none to restart before the deadline

    def logs(self) -> str:
        return "\n".join(w.log.read_text(errors="replace") for w in self.workers if w.log.exists())


LAB_PREFIX = "dm-faults-"


def sweep_abandoned_labs() -> None:
    """Stop the cluster, unmount the disks and remove the files of labs whose process died
    without closing them (a worker left behind ends once its database is gone)."""
    for root in Path(tempfile.gettempdir()).glob(f"{LAB_PREFIX}*-*"):
        owner = root.name.removeprefix(LAB_PREFIX).split("-")[0]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        if (ScratchCluster.data_dir(root) / "postmaster.pid").exists():
            ScratchCluster.stop_abandoned(root)
        run_command("umount", "--lazy", str(ScratchCluster.disk_dir(root)), check=False)
        for disk in root.glob("trial*/disk"):
            run_command("umount", "--lazy", str(disk), check=False)
        shutil.rmtree(root, ignore_errors=True)


class FaultLab:
    def __init__(self, *, workers: int = 2, clips: int = 3, settle_s: float = 240):
        reason = missing_requirements()
        if reason:
            raise RuntimeError(reason)
        self.max_workers, self.settle_s = workers, settle_s
        sweep_abandoned_labs()
        self.root = Path(tempfile.mkdtemp(prefix=f"{LAB_PREFIX}{os.getpid()}-"))
        self.root.chmod(0o755)  # the cluster runs as postgres
        self._stack = contextlib.ExitStack()
        self._trials = 0
        self._reference = None
        try:
            self.network = Network(workers)
            self._stack.callback(self.network.close)
            self.cluster = ScratchCluster(self.root, self.network.service_address)
            self._stack.callback(self.cluster.close)
            self.cluster.migrate_template()
            self.urls, self.siglip, self.yolo = self._media(clips)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> FaultLab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _media(self, clips: int) -> tuple[list[str], Path, Path]:
        from dataminer_dagster.core.synthetic import write_scene_clips
        from dataminer_dagster.demo import serve_directory
        from dataminer_dagster.models.tiny import build_tiny_siglip
        from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

        write_scene_clips(self.root / "www", clips)
        siglip = build_tiny_siglip(self.root / "siglip")
        yolo = build_tiny_yolo(self.root / "yolo.pt")
        base = self._stack.enter_context(
            serve_directory(self.root / "www", host=self.network.service_address)
        )
        return [f"{base}/sample{i:02d}.mp4" for i in range(clips)], siglip, yolo

    @property
    def reference(self):
        """The clean run (no fault), what every schedule is checked against."""
        if self._reference is None:
            from tests.helpers.fault_checks import Reference

            self._reference = Reference.of(self.run(Schedule((), self.max_workers), clean=True))
        return self._reference

    def run(self, schedule: Schedule, *, clean: bool = False):
        """Play `schedule` and check the result (`fault_checks.Outcome`); `clean`: this is the
        reference run, checked against nothing but itself."""
        from tests.helpers.fault_checks import check

        if schedule.workers > self.max_workers:
            raise ValueError(
                f"the lab has {self.max_workers} worker machines, not {schedule.workers}"
            )
        reference = None if clean else self.reference
        with self._trial(schedule) as trial:
            self._play(trial)
            self._undo(trial)
            return check(trial, reference)

    @contextlib.contextmanager
    def _trial(self, schedule: Schedule) -> Iterator[Trial]:
        self._trials += 1
        name = f"trial{self._trials}"
        root = self.root / name
        disk = root / "disk"
        disk.mkdir(parents=True)
        run_command("mount", "-t", "tmpfs", "-o", f"size={FILES_DISK_MB}m", "tmpfs", str(disk))
        try:
            url = self.cluster.new_database(name)
            trial = Trial(schedule, root, name, url, disk / "data", disk / "out" / PROJECT)
            try:
                self._prepare(trial)
                yield trial
            finally:
                self._undo(trial)
                self.cluster.drop(name)
        finally:
            run_command("umount", "--lazy", str(disk), check=False)

    def _environment(self, trial: Trial, worker: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMINER_", "DAGSTER_"))}
        env.update(
            DATAMINER_HOME=str(trial.root / f"home{worker}"),
            DATAMINER_DATABASE_URL=trial.url,
            DATAMINER_DATA_DIR=str(trial.data_dir),
            DATAMINER_SETTINGS=str(trial.root / "settings.yaml"),
            PYTHONPATH=str(REPO_ROOT),
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            YOLO_OFFLINE="1",
            DAGSTER_DISABLE_TELEMETRY="1",
        )
        if any(f.kind == "clock_offset" and f.worker == worker for f in trial.schedule.faults):
            env["PYTHONPATH"] = f"{CLOCK_OFFSET_DIR}{os.pathsep}{REPO_ROOT}"
            env["DATAMINER_FAULTS_CLOCK_FILE"] = str(self._clock_file(trial, worker))
        return env

    @staticmethod
    def _clock_file(trial: Trial, worker: int) -> Path:
        """Seconds that worker's clock is off by (tests/helpers/clock_offset/sitecustomize.py)."""
        return trial.root / f"clock{worker}"

    def _prepare(self, trial: Trial) -> None:
        (trial.root / "settings.yaml").write_text(yaml.safe_dump(SETTINGS))
        config = trial.root / f"{PROJECT}.yaml"
        project = demo_project(PROJECT, self.urls, self.siglip, self.yolo)
        # A reserve that fits the lab's small data disk, which only the nemesis fills.
        project["download"]["min_free_disk_mb"] = 1
        project["extract"]["min_free_disk_mb"] = 1
        config.write_text(yaml.safe_dump({**project, "output_dir": str(trial.output_dir)}))
        for i in range(trial.schedule.workers):
            (trial.root / f"home{i}").mkdir()
            trial.workers.append(
                Worker(
                    i,
                    self.network.namespace(i),
                    self._environment(trial, i),
                    config,
                    trial.root / f"worker{i}.log",
                )
            )
        added = subprocess.run(
            [str(BIN / "dataminer"), "project", "add", str(config)],
            cwd=REPO_ROOT,
            env=trial.workers[0].env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if added.returncode != 0:
            raise RuntimeError(f"dataminer project add: {added.stdout}{added.stderr}")

    def _undo(self, trial: Trial) -> None:
        for worker in trial.workers:
            worker.kill()
        for i in range(trial.schedule.workers):
            self.network.heal(i)
        # The disks are emptied first: a server stopped while its disk was full cannot start
        # (it writes on the way up).
        filler_of(trial.data_dir).unlink(missing_ok=True)
        filler_of(self.cluster.disk).unlink(missing_ok=True)
        if not self.cluster.running():
            self.cluster.start()
        with contextlib.suppress(sa.exc.SQLAlchemyError):
            self.cluster.admin("ALTER SYSTEM RESET synchronous_standby_names")
            self.cluster.admin("SELECT pg_reload_conf()")

    def _play(self, trial: Trial) -> None:
        for worker in trial.workers:
            worker.start()
        zero = self._first_item_begun(trial)
        events = self._events(trial)
        deadline = zero + max((t for t, _ in events), default=0) + self.settle_s
        while time.monotonic() < deadline:
            now = time.monotonic() - zero
            while events and events[0][0] <= now:
                _, action = events.pop(0)
                if action() is False:  # not possible yet: tried again in a while
                    events = sorted([*events, (now + RETRY_S, action)], key=lambda e: e[0])
            self._supervise(trial)
            if not events and not any(w.running or w.restart_at for w in trial.workers):
                trial.finished = True
                break
            time.sleep(0.05)
        trial.work_seconds = time.monotonic() - zero
        if not trial.finished:
            trial.notes.append(f"workers still running {self.settle_s:.0f} s after the last fault")

    def _first_item_begun(self, trial: Trial) -> float:
        """When a worker began the first item (the schedule's time zero); workers that die before
        then are restarted as at any other time."""
        engine = sa.create_engine(
            trial.url.replace("postgresql://", "postgresql+psycopg://"), poolclass=sa.pool.NullPool
        )
        deadline = time.monotonic() + self.settle_s
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(sa.exc.OperationalError), engine.connect() as c:
                    if c.execute(
                        sa.text(
                            "SELECT 1 FROM dataminer.work_items "
                            "WHERE started_at IS NOT NULL OR status = 'done' LIMIT 1"
                        )
                    ).first():
                        return time.monotonic()
                self._supervise(trial)
                time.sleep(0.05)
        finally:
            engine.dispose()
        raise RuntimeError(f"no item begun in {self.settle_s:.0f} s:\n{trial.logs()[-4000:]}")

    def _events(self, trial: Trial) -> list[tuple[float, Action]]:
        """(time, action) of every injection and every healing, in time order."""
        events = []
        for fault in trial.schedule.faults:
            inject, heal = self._actions(trial, fault)
            events.append((fault.at_s, inject))
            events.append((fault.at_s + fault.lasts_s, heal))
        return sorted(events, key=lambda e: e[0])

    def _actions(self, trial: Trial, fault: Fault) -> tuple[Action, Action]:
        worker = trial.workers[fault.worker] if fault.worker < len(trial.workers) else None
        note = trial.notes.append

        def nothing() -> None:
            pass

        if fault.kind == "partition":
            return (
                lambda: (self.network.partition(fault.worker), note(fault.describe())),
                lambda: self.network.heal(fault.worker),
            )
        if fault.kind in ("db_stop_fast", "db_stop_immediate"):
            mode = fault.kind.removeprefix("db_stop_")

            def start() -> bool:
                # A server cannot start while its disk is full (another fault): as an operator
                # would, start it once the disk has room again.
                if filler_of(self.cluster.disk).exists():
                    return False
                self.cluster.start()
                return True

            return (lambda: (self.cluster.stop(mode), note(fault.describe())), start)
        if fault.kind == "commit_cut":
            address = self.network.worker_address(fault.worker)
            return (
                lambda: note(
                    f"{fault.describe()}: {self.cluster.cut_commit(address, fault.lasts_s)}"
                ),
                nothing,
            )
        if fault.kind == "clock_offset":
            clock = self._clock_file(trial, fault.worker)
            return (
                lambda: (clock.write_text(str(fault.offset_s)), note(fault.describe())),
                lambda: clock.write_text("0"),
            )
        if fault.kind == "disk_full":
            return (
                lambda: (fill(trial.data_dir), note(fault.describe())),
                lambda: filler_of(trial.data_dir).unlink(missing_ok=True),
            )
        if fault.kind == "db_disk_full":
            return (
                lambda: (fill(self.cluster.disk), note(fault.describe())),
                lambda: filler_of(self.cluster.disk).unlink(missing_ok=True),
            )
        return (
            lambda: self._kill(worker, fault, note),
            lambda: self._restart_killed(trial, worker),
        )

    def _kill(self, worker: Worker, fault: Fault, note: Callable[[str], None]) -> None:
        if not worker.running:
            note(f"{fault.describe()}: the worker was not running")
            return
        worker.killed_by_nemesis = True
        worker.kill()
        note(fault.describe())

    def _restart_killed(self, trial: Trial, worker: Worker) -> None:
        if not worker.killed_by_nemesis or worker.running:
            return
        if self._project_stage(trial) in FINISHED_STAGES:
            worker.killed_by_nemesis, worker.finished = False, True
        else:
            worker.start()

    def _supervise(self, trial: Trial) -> None:
        """Restart a worker that exited on its own (recording why), as a service manager would;
        leave one the nemesis killed down until its fault ends."""
        for worker in trial.workers:
            if worker.restart_at is not None and time.monotonic() >= worker.restart_at:
                worker.restarts += 1
                worker.start()
                continue
            if worker.process is None or worker.running or worker.killed_by_nemesis:
                continue
            if worker.finished or worker.gave_up or worker.restart_at is not None:
                continue
            code = worker.process.returncode
            if code == 0:
                worker.finished = True
                continue
            worker.exits.append(f"worker {worker.index} exited with {code}: {worker.last_error()}")
            if self._project_stage(trial) in FINISHED_STAGES or worker.restarts >= MAX_RESTARTS:
                worker.gave_up = True
            else:
                worker.restart_at = time.monotonic() + RESTART_AFTER_S

    def _project_stage(self, trial: Trial) -> str | None:
        try:
            rows = self.cluster.admin(
                "SELECT stage FROM dataminer.projects WHERE name = :n", trial.database, n=PROJECT
            )
        except sa.exc.OperationalError:
            return None
        return rows[0].stage if rows else None
