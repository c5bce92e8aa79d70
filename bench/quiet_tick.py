"""The work sensor's discovery on a tick that finds nothing new, against a large catalog: when the
catalog's keys are compared with Dagster's (every `COMPARE_EVERY_S`) and when they are not.

    python bench/quiet_tick.py                    # 100,000 videos, as many project videos
    python bench/quiet_tick.py --videos 10000

Dagster's storage and the claim tables share a scratch database on the given server (the
repository's dagster.yaml, as `dagster dev` uses it); it is dropped at the end.
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

SCRATCH = "dataminer_bench_quiet_tick"
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
    server = sa.make_url(args.database_url)
    admin = sa.create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)"))
        c.execute(sa.text(f"CREATE DATABASE {SCRATCH}"))
    home = Path(tempfile.mkdtemp(prefix="dataminer-bench-"))
    try:
        shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
        url = server.set(database=SCRATCH).render_as_string(hide_password=False)
        os.environ.update(DAGSTER_HOME=str(home), DATAMINER_DATABASE_URL=url)
        import dagster as dg

        from dataminer_dagster.db.engine import dispose_engines, get_engine
        from dataminer_dagster.db.migrate import ensure_schema
        from dataminer_dagster.sensors.planning import (
            COMPARE_EVERY_S,
            DiscoveryCursor,
            plan_discovery,
        )

        engine = get_engine(url)
        ensure_schema(engine)
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

        due = median_ms(found.cursor)  # compared_at 0: due on every call
        recent = DiscoveryCursor(**{**found.cursor.__dict__, "compared_at": time.time()})
        not_due = median_ms(recent)
        instance.dispose()
        dispose_engines()
        print(
            f"{args.videos:,} videos and project videos, median of {args.repeats}: a quiet tick "
            f"comparing the keys {due:.0f} ms, one not due to compare {not_due:.1f} ms "
            f"(compared at most every {COMPARE_EVERY_S:g} s)"
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
        with admin.connect() as c:
            c.execute(sa.text(f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)"))


if __name__ == "__main__":
    main()
