"""The lease reaper's per-tick question, "which running items are held far longer than usual?"
(`RunLiveness.long_running`), against a history of finished items, with and without the
`work_items_finished` index (migration 0005), in one run on one database.

    python bench/long_running.py                          # 100,000 finished items per stage
    python bench/long_running.py --rows 1000000 --database-url postgresql://postgres@127.0.0.1:5432/postgres

A scratch database (bench/databases.py) is created on the given server and dropped at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time

import sqlalchemy as sa
from databases import scratch_database  # bench/databases.py

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.settings import LongRunningPolicy

STAGES = ("download", "frames", "filter")


def fill(engine: sa.Engine, rows: int) -> None:
    """`rows` finished items per stage, 5 s each, and 3 running ones per stage."""
    with engine.begin() as c:
        for stage in STAGES:
            c.execute(
                sa.text("""
                    INSERT INTO dataminer.work_items
                           (stage, item_key, status, started_at, finished_at, max_attempts)
                    SELECT :stage, 'done-' || g, 'done', now() - make_interval(secs => g + 5),
                           now() - make_interval(secs => g), 3
                      FROM generate_series(1, :rows) g"""),
                {"stage": stage, "rows": rows},
            )
            c.execute(
                sa.text("""
                    INSERT INTO dataminer.work_items (stage, item_key, status, started_at,
                                                      lease_owner, lease_token, max_attempts)
                    SELECT :stage, 'running-' || g, 'running', now(), 'run-x',
                           gen_random_uuid(), 3
                      FROM generate_series(1, 3) g"""),
                {"stage": stage},
            )
        c.execute(sa.text("ANALYZE dataminer.work_items"))


def median_ms(store: LeaseStore, repeats: int) -> float:
    policy = LongRunningPolicy()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        store.liveness.long_running(policy)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="finished items per stage")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with scratch_database(args.database_url, "bench_long_running") as url:
        engine = get_engine(url)
        fill(engine, args.rows)
        store = LeaseStore(engine)
        with_index = median_ms(store, args.repeats)
        with engine.begin() as c:
            c.execute(sa.text("DROP INDEX dataminer.work_items_finished"))
        without = median_ms(store, args.repeats)
    print(
        f"{args.rows:,} finished items per stage ({len(STAGES)} stages), median of "
        f"{args.repeats}: with the index {with_index:.1f} ms, without {without:.1f} ms "
        f"({without / with_index:.0f}x)"
    )


if __name__ == "__main__":
    main()
