"""The work sensor's discovery on a tick that finds nothing new, against a large catalog: when the
catalog is compared with Dagster by counts (every `COMPARE_EVERY_S`), when a step of the key by
key pass is made (the counts differ, or every `FULL_COMPARE_EVERY_S`; about `COMPARE_STEP_S` a
tick) and the whole pass, and when it is not compared; and its run planning (`plan_runs`, every
lane) with nothing to request, which looks up Dagster's partition order by key: the first call
of a process costs what the next ones do.

    python bench/quiet_tick.py                    # 100,000 videos, as many project videos
    python bench/quiet_tick.py --videos 10000

Dagster's storage and the claim tables share a scratch database on the given server
(bench/databases.py; the repository's dagster.yaml, as `dagster dev` uses it); it is dropped at
the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from databases import scratch_database  # bench/databases.py

REPO = Path(__file__).resolve().parents[1]


def fill(engine: sa.Engine, videos: int) -> None:
    """One project using `videos` videos."""
    with engine.begin() as c:
        c.execute(
            sa.text("""INSERT INTO dataminer.projects (name, config, config_hash, output_dir)
                       VALUES ('bench', '{}'::jsonb, 'bench', '/nonexistent/bench')""")
        )
        c.execute(
            sa.text("""INSERT INTO dataminer.videos (video_id, url)
                       SELECT 'v' || g, 'https://example.com/' || g
                         FROM generate_series(1, :n) g"""),
            {"n": videos},
        )
        c.execute(
            sa.text("""INSERT INTO dataminer.project_videos (project_id, video_id, source)
                       SELECT p.id, 'v' || g, 'url' FROM generate_series(1, :n) g,
                              dataminer.projects p"""),
            {"n": videos},
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with (
        scratch_database(args.database_url, "bench_quiet_tick") as url,
        tempfile.TemporaryDirectory(prefix="dataminer-bench-") as home,
    ):
        shutil.copy(REPO / "dagster.yaml", Path(home) / "dagster.yaml")
        os.environ.update(DAGSTER_HOME=home, DATAMINER_DATABASE_URL=url)
        import dagster as dg

        from dataminer_dagster.db.engine import get_engine
        from dataminer_dagster.engine.discovery import (
            COMPARE_EVERY_S,
            COMPARE_STEP_S,
            FULL_COMPARE_EVERY_S,
            DiscoveryCursor,
            plan_discovery,
        )

        engine = get_engine(url)
        fill(engine, args.videos)
        instance = dg.DagsterInstance.get()
        found = plan_discovery(engine, DiscoveryCursor(), budget=10**9)
        found.apply(instance)

        def median_ms(cursor: DiscoveryCursor) -> float:
            times = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                quiet = plan_discovery(engine, cursor, instance=instance)
                times.append(time.perf_counter() - started)
                assert not quiet.count and not quiet.removals
            return statistics.median(times) * 1000

        def cursor(**times: float) -> DiscoveryCursor:
            """The discovery cursor with these comparison times: due or not, from now."""
            return DiscoveryCursor(**{**found.cursor.__dict__, **times})

        step = median_ms(cursor(compared_at=0.0, full_compared_at=0.0))  # a pass's first step
        counts_due = median_ms(cursor(compared_at=0.0, full_compared_at=time.time()))
        not_due = median_ms(cursor(compared_at=time.time()))
        passing, steps, started = cursor(compared_at=0.0, full_compared_at=0.0), 0, time.time()
        while True:  # the whole pass, step by step, as ticks make it
            passing = plan_discovery(engine, passing, instance=instance).cursor
            steps += 1
            if passing.full_pass is None and passing.comparing is None:
                break
        whole_pass_s = time.time() - started

        from dataminer_dagster.db.leases import LeaseStore
        from dataminer_dagster.engine.planning import plan_runs
        from dataminer_dagster.lanes import configured_lanes
        from dataminer_dagster.settings import load_settings

        store, lanes = LeaseStore(engine), configured_lanes(load_settings())
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            assert plan_runs(instance, store, lanes) == []
            times.append(time.perf_counter() - started)
        planning_ms = statistics.median(times) * 1000
        instance.dispose()
    print(
        f"{args.videos:,} videos and project videos, median of {args.repeats}: a quiet tick "
        f"making a step of the key-by-key pass ({COMPARE_STEP_S:g} s) {step:.1f} ms, "
        f"comparing the counts {counts_due:.1f} ms, not due to compare {not_due:.1f} ms (counts at "
        f"most every {COMPARE_EVERY_S:g} s, a pass every {FULL_COMPARE_EVERY_S:g} s or when the "
        f"counts differ: {steps} steps, {whole_pass_s:.1f} s in all); planning runs "
        f"{planning_ms:.1f} ms; load average {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
