"""Orchestration overhead: what the pipeline costs per video and stage when the stages do nothing.

N videos go through the real machinery (catalog rows, work items, the sensors' decisions, Dagster
runs with partition ranges, claims, completion transactions, materialization events, project
transitions) with stage functions that do no media work (bench/noop_pipeline.py): downloads,
frames and filtered_frames only record their result and queue the next stage, exactly as the real
ones do. The time spent inside the stage functions is recorded on each work item and subtracted;
what is left is overhead, divided by 3 video-stages per video.

Two modes, on a Dagster instance whose storage is the embedded PostgreSQL (the repository's
dagster.yaml):
* in-process: runs execute in this process, as `dataminer run` does (no process start per run);
* daemon: a real `dagster-daemon run` on a workspace of the no-op pipeline with the product's
  sensors; the sensors request the runs and the daemon launches each in a new process, as under
  `dagster dev`. The clock starts when the project's rows are in the claim tables.

    python bench/orchestration.py --mode in-process --videos 200 2000
    python bench/orchestration.py --mode daemon --videos 200
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))


def setup_project(videos: int, root: Path):
    """A project of `videos` local files, its catalog done: its downloads are queued."""
    from dataminer_dagster.acquisition.video_ids import Candidate
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.schema import DONE
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.registry import CATALOG
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    engine = get_engine(claims_database_url(settings))
    migrate.ensure_schema(engine)
    store = LeaseStore(engine, settings.retry)
    catalog = Catalog(engine, store, DataPaths(settings.data_dir))
    name = f"bench{videos}"
    sources = root / name
    sources.mkdir(parents=True)
    candidates = []
    for i in range(videos):
        path = sources / f"v{i:05d}.mp4"
        path.touch()
        candidates.append(Candidate(f"{name}-{i:05d}", "file", "bench", source_path=str(path)))
    config = parse_project_config(
        {
            "name": name,
            "inputs": {"files": [str(sources / "*.mp4")]},
            "filter": {"positive_prompts": ["x"]},
        }
    )
    project = catalog.projects.register(config).project
    with engine.begin() as conn:
        catalog.videos.link(conn, project, candidates)
        catalog.advance_videos(conn, [c.video_id for c in candidates])
        store.mark(CATALOG, name, DONE, "bench", project_id=project.id, conn=conn)
    return name, store


def stage_work_seconds(store, name: str) -> float:
    import sqlalchemy as sa

    with store.engine.connect() as c:
        return float(
            c.execute(
                sa.text("""SELECT coalesce(sum(CAST(outcome ->> 'work_s' AS float)), 0)
                             FROM dataminer.work_items WHERE outcome ? 'work_s'""")
            ).scalar()
        )


def project_stage(store, name: str) -> str:
    import sqlalchemy as sa

    with store.engine.connect() as c:
        return c.execute(
            sa.text("SELECT stage FROM dataminer.projects WHERE name = :n"), {"n": name}
        ).scalar()


def result(videos: int, runs: int, wall: float, work: float) -> dict:
    return {
        "videos": videos,
        "runs": runs,
        "wall_s": wall,
        "stage_work_s": work,
        "overhead_per_video_stage_s": (wall - work) / (3 * videos),
    }


def run_in_process(videos: int, root: Path) -> dict:
    import dagster as dg
    from noop_pipeline import build_definitions

    from dataminer_dagster.engine.planning import RunLimits
    from dataminer_dagster.hosting.driver import drive
    from dataminer_dagster.settings import LeasePolicy, RunPolicy

    name, store = setup_project(videos, root)
    stages, defs = build_definitions(with_sensors=False)
    instance = dg.DagsterInstance.get()
    started = time.perf_counter()
    outcome = drive(
        [name],
        instance=instance,
        defs=defs,
        store=store,
        limits=RunLimits(LeasePolicy(stale_after_s=600), RunPolicy()),
        log=lambda m: None,
        stages=stages,
    )
    wall = time.perf_counter() - started
    assert outcome.stages == {name: "complete"}, outcome
    return result(videos, outcome.runs, wall, stage_work_seconds(store, name))


def run_daemon(videos: int, root: Path) -> dict:
    import dagster as dg

    workspace = root / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_file:\n"
        f"      relative_path: {REPO / 'bench' / 'noop_pipeline.py'}\n"
        "      attribute: defs\n"
        f"      working_directory: {REPO}\n"
    )
    log = (root / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", str(workspace)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for_first_tick(root / "daemon.log")
        name, store = setup_project(videos, root)
        started = time.perf_counter()
        while project_stage(store, name) != "complete":
            if time.perf_counter() - started > 1800:
                raise TimeoutError(f"{name} not complete after 30 min; see {root / 'daemon.log'}")
            time.sleep(0.2)
        wall = time.perf_counter() - started
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)
        log.close()
    runs = len(dg.DagsterInstance.get().get_runs())
    return result(videos, runs, wall, stage_work_seconds(store, name))


def _wait_for_first_tick(log: Path, timeout_s: float = 180) -> None:
    """The code server is up and the work sensor has ticked once."""
    deadline = time.monotonic() + timeout_s
    while "Sensor work skipped" not in log.read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the work sensor did not tick in {timeout_s:.0f} s; see {log}")
        time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=["in-process", "daemon"], default="in-process")
    parser.add_argument("--videos", type=int, nargs="+", default=[200])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    run = run_daemon if args.mode == "daemon" else run_in_process
    print(f"mode: {args.mode}")
    print("| videos | runs | wall s | stage work s | overhead per video-stage |")
    print("|---:|---:|---:|---:|---:|")
    for n in args.videos:
        # A fresh home per size: the embedded server, Dagster's history and the claim tables.
        root = Path(tempfile.mkdtemp(prefix="bench-orchestration-"))
        os.environ["DATAMINER_HOME"] = str(root / "home")
        os.environ["DAGSTER_HOME"] = str(root / "dagster")
        (root / "dagster").mkdir()
        shutil.copy(REPO / "dagster.yaml", root / "dagster" / "dagster.yaml")
        try:
            r = run(n, root)
        finally:
            subprocess.run(
                [str(Path(sys.executable).parent / "dataminer"), "db", "stop"], capture_output=True
            )
            from dataminer_dagster.db.engine import dispose_engines

            dispose_engines()
            shutil.rmtree(root, ignore_errors=True)
        print(
            f"| {r['videos']:,} | {r['runs']} | {r['wall_s']:.1f} | {r['stage_work_s']:.2f} | "
            f"{r['overhead_per_video_stage_s'] * 1000:.1f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
