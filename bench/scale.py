"""The orchestration figures of a catalog of N videos, filled through the product's own bulk path,
in one command (issue 25, item 5; the UI's figures, item 4, are not measured here).

For each of `--sizes` (a fresh database each; Dagster's storage and the claim tables share it, the
repository's dagster.yaml, as `dagster dev` uses it):

* **fill**: one project linking N videos with `Catalog.link_and_queue` (the catalog stage's and
  `populate`'s path: the videos, the project's links and their download items), in transactions
  of `--chunk` videos;
* **discover**: the work sensor's discovery (`plan_discovery`, then `Discovery.add`), tick by
  tick, until every row is a partition: partitions added per second;
* **copy**: the fill's videos' progress copied onto their links (db/link_progress.py), as the
  ticks after a bulk fill copy it, `COPY_LIMIT` notes a tick: notes copied per second;
* **quiet tick**: a tick that finds nothing new, right after the fill (before PostgreSQL's
  statistics caught up) and after a VACUUM ANALYZE (as autovacuum leaves them): its discovery when no
  comparison is due, when the counts are compared and when a step of the key-by-key pass is
  made; its run planning (`plan_runs`, every lane, Dagster's order looked up by key);
  `advance_projects`; and the whole tick as the work sensor runs it (`plan_cycle`, with the
  stages' keys and config versions, no comparison due); each a median of `--repeats`;
* **comparisons**: the whole key-by-key pass, step by step as ticks make it (steps, seconds);
  a row the cursor passed (committed after rows with higher ids): the ticks and time until its
  comparison, set off by the counts, has made it a partition;
* **1,000 new videos**: linked, then one tick's discovery, partitions and planning; and again
  with the whole tick (`plan_cycle`, then the partitions added);
* **status**: `dataminer status`, `dataminer status --json` and `dataminer status scale` (the
  project's own; subprocesses: Python's start included);
* with `--daemon-s S`, **under `dagster-daemon run`** (the repository's workspace, runs queued
  but not launched): how long its work sensor takes to catch up (it starts without a cursor),
  S seconds of its ticks, then the tick that finds 1,000 new videos, from Dagster's tick records.

The load average is printed before and after each size; a table at the end, and
bench/results/scale.json.

    python bench/scale.py                                  # 10,000 and 100,000 videos
    python bench/scale.py --sizes 1000000 --repeats 3 --daemon-s 120
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from databases import catalog_home  # bench/databases.py
from status import timed_command  # bench/status.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NEW_VIDEOS = 1_000


def median_ms(step: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def link(catalog, project, first: int, count: int, chunk: int) -> None:
    """Link videos `first` .. `first + count - 1` to the project, as the catalog stage does."""
    from dataminer_dagster.acquisition.video_ids import Candidate

    for start in range(first, first + count, chunk):
        candidates = [
            Candidate(f"v{n:08d}", "url", url=f"https://example.com/{n}.mp4")
            for n in range(start, min(start + chunk, first + count))
        ]
        with catalog.engine.begin() as conn:
            catalog.link_and_queue(conn, project, candidates)


def scale_project(catalog, home: Path):
    """The project `scale`, registered as `dataminer project add` registers it."""
    from dataminer_dagster.config import parse_project_config

    return catalog.projects.register(
        parse_project_config(
            {
                "name": "scale",
                "output_dir": str(home / "out"),
                "inputs": {"urls": ["https://example.com/placeholder.mp4"]},
                "filter": {"positive_prompts": ["a thing"]},
            }
        )
    ).project


def measure(
    url: str, home: Path, size: int, repeats: int, chunk: int, daemon_s: float
) -> dict[str, float]:
    import dagster as dg

    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.link_progress import copy_link_progress
    from dataminer_dagster.db.project_flow import advance_projects
    from dataminer_dagster.engine.assembly import stage_assets
    from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
    from dataminer_dagster.engine.planning import RunLimits, plan_cycle, plan_runs
    from dataminer_dagster.lanes import configured_lanes
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    engine = get_engine(url)
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(home / "data"))
    project = scale_project(catalog, home)
    figures: dict[str, float] = {}
    started = time.perf_counter()
    link(catalog, project, 0, size, chunk)
    figures["fill_s"] = time.perf_counter() - started

    instance = dg.DagsterInstance.get()
    lanes = configured_lanes(settings)
    limits = RunLimits(settings.lease, settings.runs)
    cursor, added, ticks = DiscoveryCursor(), 0, 0
    started = time.perf_counter()
    while True:
        found = plan_discovery(engine, cursor, instance=instance)
        if not found.count and not found.removals:
            break
        found.apply(instance)
        added, ticks, cursor = added + found.count, ticks + 1, found.cursor
    figures["discover_s"] = time.perf_counter() - started
    figures["discover_keys_per_s"] = added / figures["discover_s"]
    figures["discover_ticks"] = ticks

    def with_times(**times: float) -> DiscoveryCursor:
        return DiscoveryCursor(**{**cursor.__dict__, **times})

    plan = lambda: plan_runs(instance, store, lanes, limits=limits)  # noqa: E731
    stages = stage_assets()
    tick_options = {
        "stage_keys": {stage: s.key for stage, s in stages.items()},
        "config_keys": {stage: s.config_key for stage, s in stages.items() if s.config_key},
        "limits": limits,
    }

    def tick() -> None:  # as the work sensor's: discovery, transitions, acquisition, runs
        nonlocal cursor
        cycle = plan_cycle(
            instance, store, lanes, with_times(compared_at=time.time()), **tick_options
        )
        cursor = cycle.discovery.cursor

    # The fill's videos' progress copied onto their links (each was noted twice: linked, its
    # download queued), as the ticks after a bulk fill do, COPY_LIMIT notes a tick.
    started, copied = time.perf_counter(), 0
    while n := copy_link_progress(engine):
        copied += n
    figures["copy_s"] = time.perf_counter() - started
    figures["copy_notes_per_s"] = copied / figures["copy_s"] if figures["copy_s"] else 0.0
    tick()  # its first observes the projects' config versions
    # Right after the bulk fill PostgreSQL's statistics still describe small tables (autovacuum
    # analyzes them within a minute or two); the ticks then are measured once as they are, then
    # after ANALYZE, as a deployment runs.
    figures["quiet_tick_before_analyze_ms"] = median_ms(tick, repeats)
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql("VACUUM ANALYZE")  # the copies' old versions of the links, too
    figures["analyze_s"] = time.perf_counter() - started
    figures["quiet_discovery_ms"] = median_ms(
        lambda: plan_discovery(engine, with_times(compared_at=time.time()), instance=instance),
        repeats,
    )
    figures["quiet_counts_ms"] = median_ms(
        lambda: plan_discovery(
            engine, with_times(compared_at=0.0, full_compared_at=time.time()), instance=instance
        ),
        repeats,
    )
    figures["quiet_compare_step_ms"] = median_ms(
        lambda: plan_discovery(
            engine, with_times(compared_at=0.0, full_compared_at=0.0), instance=instance
        ),
        repeats,
    )
    figures["quiet_planning_ms"] = median_ms(plan, repeats)
    figures["advance_projects_ms"] = median_ms(lambda: advance_projects(store), repeats)
    figures["quiet_tick_ms"] = median_ms(tick, repeats)
    compared, cursor = comparisons(engine, instance, catalog, project, with_times, size, chunk)
    figures.update(compared)

    link(catalog, project, size + 1, NEW_VIDEOS, chunk)
    started = time.perf_counter()
    found = plan_discovery(engine, with_times(compared_at=time.time()), instance=instance)
    found.add(instance)
    plan_runs(instance, store, lanes, limits=limits, discovery=found)
    cursor = found.cursor
    figures["tick_with_new_rows_ms"] = (time.perf_counter() - started) * 1000
    figures["new_rows_found"] = found.count
    link(catalog, project, size + 1 + NEW_VIDEOS, NEW_VIDEOS, chunk)
    figures["whole_tick_with_new_rows_ms"] = median_ms(tick, 1)
    instance.dispose()

    env = {**os.environ, "DATAMINER_DATABASE_URL": url, "DATAMINER_HOME": str(home)}
    figures["status_s"] = timed_command(env, "status")
    figures["status_json_s"] = timed_command(env, "status", "--json")
    figures["project_status_s"] = timed_command(env, "status", project.name)
    if daemon_s:
        compared = with_times(full_compared_at=time.time())  # a deployment's: keys just compared
        figures.update(
            daemon_ticks(url, home, catalog, project, compared, size + 1 + 2 * NEW_VIDEOS, daemon_s)
        )
    return figures


def comparisons(engine, instance, catalog, project, with_times, size: int, chunk: int):
    """The whole key-by-key pass, tick by tick; then a row that the cursor passed (video `size`,
    linked after the cursor moved past its id), found by the comparison its count sets off.
    (The figures, the discovery cursor after them.)"""
    from dataminer_dagster.engine.discovery import plan_discovery

    figures: dict[str, float] = {}
    cursor, steps, started = with_times(compared_at=0.0, full_compared_at=0.0), 0, time.time()
    while True:
        found = plan_discovery(engine, cursor, instance=instance)
        found.apply(instance)
        cursor, steps = found.cursor, steps + 1
        if cursor.full_pass is None and cursor.comparing is None:
            break
    figures["full_pass_s"], figures["full_pass_steps"] = time.time() - started, steps
    link(catalog, project, size, 1, chunk)
    with engine.connect() as c:  # as if a row with a higher id had been found first
        ids = [
            c.exec_driver_sql(f"SELECT max(id) FROM dataminer.{table}").scalar()
            for table in ("videos", "project_videos")
        ]
    cursor = with_times(
        video=ids[0], project_video=ids[1], compared_at=0.0, full_compared_at=time.time()
    )
    steps, started = 0, time.time()
    while cursor.comparing is not None or steps == 0:
        found = plan_discovery(engine, cursor, instance=instance)
        found.apply(instance)
        cursor, steps = found.cursor, steps + 1
    assert instance.has_dynamic_partition("videos", f"v{size:08d}"), "the passed row is found"
    figures["passed_row_found_ticks"] = steps
    figures["passed_row_found_ms"] = (time.time() - started) * 1000
    return figures, cursor


def daemon_ticks(
    url: str, home: Path, catalog, project, cursor, first: int, quiet_s: float
) -> dict:
    """The work sensor's ticks under a real `dagster-daemon run` on the repository's workspace
    and this catalog (its dagster.yaml with `max_concurrent_runs: 0`: the runs it requests are
    queued, none is launched, so a tick costs what the sensor does, not what runs do). The
    daemon's sensor starts without a cursor and first lists the catalog again (catching up);
    then `quiet_s` seconds of ticks; then 1,000 new videos are linked and the tick that finds
    them is recorded, from Dagster's own tick records."""
    import dagster as dg
    import yaml
    from dagster._core.scheduler.instigation import TickStatus

    from dataminer_dagster.engine.discovery import DiscoveryCursor

    config = yaml.safe_load((home / "dagster.yaml").read_text())
    config["concurrency"]["runs"]["max_concurrent_runs"] = 0
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "DATAMINER_DATABASE_URL": url, "DAGSTER_HOME": str(home)}
    env["DATAMINER_HOME"] = str(home)
    # The sensor's cursor as the in-process ticks left it, as a deployment keeps it (without
    # one, the sensor lists the whole catalog again, 25,000 keys a tick).
    # (setting a cursor stores the sensor's state as stopped: it is started again)
    dagster = str(Path(sys.executable).parent / "dagster")
    for command in (["cursor", "work", "--set", cursor.dump()], ["start", "work"]):
        subprocess.run(
            [dagster, "sensor", *command, "-w", "workspace.yaml"],
            cwd=REPO,
            env=env,
            check=True,
            capture_output=True,
        )
    with catalog.engine.connect() as c:
        last_id = c.exec_driver_sql("SELECT max(id) FROM dataminer.videos").scalar()
    log = (home / "daemon.log").open("w")
    started = time.time()
    daemon = subprocess.Popen(
        [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    instance = dg.DagsterInstance.get()

    def ticks() -> list:
        states = [s for s in instance.all_instigator_state() if s.instigator_name == "work"]
        if not states:
            return []
        state = states[0]
        found = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=100_000)
        return sorted((t for t in found if t.end_timestamp), key=lambda t: t.timestamp)

    def wait_for(condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit(f"{what}: not in {timeout_s:.0f} s (see {home}/daemon.log)")
            time.sleep(1)

    try:
        wait_for(
            lambda: any(t.status == TickStatus.SKIPPED for t in ticks()),
            1800,
            "the daemon's work sensor catching up",
        )
        caught_up = next(t for t in ticks() if t.status == TickStatus.SKIPPED).timestamp
        time.sleep(quiet_s)
        link(catalog, project, first, NEW_VIDEOS, NEW_VIDEOS)
        linked = time.time()
        last = f"v{first + NEW_VIDEOS - 1:08d}"
        wait_for(lambda: instance.has_dynamic_partition("videos", last), 300, "the new videos")
        visible = time.time()
        time.sleep(5)
        recorded = ticks()
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
        log.close()
        instance.dispose()
    quiet = [
        (t.end_timestamp - t.timestamp) * 1000
        for t in recorded
        if caught_up <= t.timestamp and t.end_timestamp < linked
    ]
    finding = next(  # the tick whose cursor passed the new videos
        t for t in recorded if t.cursor and DiscoveryCursor.parse(t.cursor).video > last_id
    )
    if not quiet:
        raise SystemExit(f"no quiet tick in {quiet_s:g} s (see {home}/daemon.log)")
    slow = [t for t in recorded if caught_up <= t.timestamp < linked]
    slow = sorted(slow, key=lambda t: t.timestamp - t.end_timestamp)[:3]
    print(  # what the slowest took and said, to explain them
        "slowest quiet ticks: "
        + "; ".join(
            f"{(t.end_timestamp - t.timestamp) * 1000:.0f} ms at +{t.timestamp - started:.0f} s, "
            f"{t.status.value}: {t.skip_reason or f'{len(t.run_ids)} runs'}"
            for t in slow
        )
    )
    return {
        "daemon_first_tick_s": recorded[0].end_timestamp - recorded[0].timestamp,
        "daemon_catch_up_s": caught_up - started,
        "daemon_quiet_ticks": len(quiet),
        "daemon_quiet_tick_median_ms": statistics.median(quiet),
        "daemon_quiet_tick_p90_ms": statistics.quantiles(quiet, n=10, method="inclusive")[-1]
        if len(quiet) > 1
        else quiet[0],
        "daemon_quiet_tick_max_ms": max(quiet),
        "daemon_tick_finding_new_ms": (finding.end_timestamp - finding.timestamp) * 1000,
        "daemon_new_videos_visible_s": visible - linked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=10_000, help="videos per transaction")
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument(
        "--daemon-s",
        type=float,
        default=0,
        help="then run dagster-daemon: this many seconds of its work sensor's quiet ticks",
    )
    args = parser.parse_args()
    results = {}
    for size in args.sizes:
        with catalog_home(args.database_url, "bench_scale") as (url, home):
            before = os.getloadavg()
            figures = measure(url, home, size, args.repeats, args.chunk, args.daemon_s)
            figures["load_before"], figures["load_after"] = before[0], os.getloadavg()[0]
        results[size] = figures
        print(f"{size:,} videos: " + json.dumps({k: round(v, 1) for k, v in figures.items()}))
    report(results, "scale")


def report(results: dict[int, dict[str, float]], name: str, digits: int = 1) -> None:
    """A Markdown table of the figures by catalog size, and bench/results/<name>.json."""
    columns = list(next(iter(results.values())))
    print("\n| videos | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for size, figures in results.items():
        print(f"| {size:,} | " + " | ".join(f"{figures[c]:,.{digits}f}" for c in columns) + " |")
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
