"""Claim throughput: our lease statements vs the reference system's claim statement.

Each configuration starts from a freshly seeded table of N pending rows and lets C claimers work on
it; the figure is items claimed and finished per second. A cycle is "claim, then complete" (ours)
or "claim, then release" (the reference: a single-row UPDATE ... WHERE id = (SELECT ... FOR UPDATE
SKIP LOCKED LIMIT 1) on a table without a status index, as in its db/operations.py;
"reference+index" is the same statement with an index on (status, created_at)). Everything runs on
the same server, in the same run.

Two kinds of claimer:
* Python: C processes calling the product's LeaseStore (SQLAlchemy, psycopg, the connection pool
  with its pre-ping), or for the reference, SQLAlchemy as the reference used it.
* pgbench: C clients of PostgreSQL's own benchmark tool running the very same statements (ours are
  taken from db/lease_sql.py), so the client costs almost nothing: what the statements alone allow.
  Skipped when pgbench is not installed.

    python bench/claims.py                       # embedded PostgreSQL in a temporary directory
    python bench/claims.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from databases import fresh_database  # bench/databases.py

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.lease_sql import COMPLETE, claim_next_statement
from dataminer_dagster.db.leases import LeaseStore

STAGE = "download"

REFERENCE_DDL = """
CREATE TABLE ref_videos (
    video_id varchar(20) PRIMARY KEY, url varchar NOT NULL, status varchar NOT NULL,
    locked_by varchar(50), locked_at timestamp, heartbeat_at timestamp,
    created_at timestamp NOT NULL, updated_at timestamp NOT NULL)
"""
REFERENCE_CLAIM = sa.text("""
UPDATE ref_videos SET locked_by = :owner, locked_at = NOW(), heartbeat_at = NOW(), status = 'DOWNLOADING'
 WHERE video_id = (SELECT video_id FROM ref_videos WHERE status = 'PENDING' AND locked_by IS NULL
                    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1)
RETURNING video_id
""")
REFERENCE_RELEASE = sa.text("""
UPDATE ref_videos SET status = 'DOWNLOADED', locked_by = NULL, locked_at = NULL, heartbeat_at = NULL,
       updated_at = NOW() WHERE video_id = :video_id AND locked_by = :owner
""")


@dataclass(frozen=True)
class Variant:
    name: str
    table: str  # reference | reference+index | ours
    claim: int = 1  # items per claim statement
    complete_together: bool = False  # ours: one statement completes the whole claim


PYTHON_VARIANTS = (
    Variant("reference", "reference"),
    Variant("reference+index", "reference+index"),
    Variant("ours, 1 per claim", "ours"),
    Variant("ours, 100/claim, 1/completion", "ours", 100),
    Variant("ours, 100/claim+completion", "ours", 100, True),
)
PGBENCH_VARIANTS = (
    Variant("reference+index", "reference+index"),
    Variant("ours, 1 per claim", "ours"),
    Variant("ours, 100/claim+completion", "ours", 100, True),
)


def _seed(url: str, table: str, rows: int) -> None:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    with engine.begin() as c:
        if table.startswith("reference"):
            c.execute(sa.text("DROP TABLE IF EXISTS ref_videos"))
            c.execute(sa.text(REFERENCE_DDL))
            if table == "reference+index":  # the index the reference lacked (its bug 20)
                c.execute(sa.text("CREATE INDEX ON ref_videos (status, created_at)"))
            c.execute(
                sa.text("""INSERT INTO ref_videos SELECT 'v' || g, 'https://x/' || g, 'PENDING', NULL, NULL,
                           NULL, now() + g * interval '1 microsecond', now() FROM generate_series(1, :n) g"""),
                {"n": rows},
            )
        else:  # download items as the catalog queues them: each about a video of its own
            c.execute(sa.text("TRUNCATE dataminer.work_items, dataminer.videos CASCADE"))
            c.execute(
                sa.text("""INSERT INTO dataminer.videos (video_id, url)
                           SELECT 'v' || g, 'https://x/' || g FROM generate_series(1, :n) g"""),
                {"n": rows},
            )
            c.execute(
                sa.text("""INSERT INTO dataminer.work_items (stage, item_key, video_id, max_attempts)
                           SELECT :stage, 'v' || g, 'v' || g, 4 FROM generate_series(1, :n) g"""),
                {"stage": STAGE, "n": rows},
            )
        c.execute(sa.text("ANALYZE"))
    engine.dispose()


# --- Python claimers ------------------------------------------------------------------------------


def _claimer(url: str, variant: Variant, start_at: float, stop_at: float) -> int:
    engine = get_engine(url)  # the product's engine settings (pre-ping included)
    owner = f"bench-{uuid.uuid4().hex[:8]}"
    done = 0
    store = LeaseStore(engine)
    store.liveness.heartbeat(owner, "bench", 0)
    while time.time() < start_at:
        time.sleep(0.001)
    while time.time() < stop_at:
        if variant.table.startswith("reference"):
            with engine.begin() as c:  # as the reference: a session per statement, then commit
                video = c.execute(REFERENCE_CLAIM, {"owner": owner}).scalar()
            if video is None:
                break
            with engine.begin() as c:
                c.execute(REFERENCE_RELEASE, {"video_id": video, "owner": owner})
            done += 1
        else:
            leases = store.claim_next(STAGE, owner, variant.claim)
            if not leases:
                break
            if variant.complete_together:
                store.complete_many(leases)
            else:
                for lease in leases:
                    store.complete(lease)
            done += len(leases)
    engine.dispose()
    return done


def run_python(url: str, variant: Variant, rows: int, claimers: int, seconds: float) -> float:
    _seed(url, variant.table, rows)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(claimers) as pool:
        start_at = time.time() + 2.0  # let every process start and connect first
        stop_at = start_at + seconds
        counts = pool.starmap(_claimer, [(url, variant, start_at, stop_at)] * claimers)
        elapsed = min(time.time(), stop_at) - start_at
    return sum(counts) / elapsed


# --- pgbench claimers -----------------------------------------------------------------------------


def _pgbench_script(variant: Variant) -> str:
    """The statements as pgbench runs them: bind parameters become pgbench variables, each client
    is its own lease owner (as each Python claimer is), and what the claim returns feeds the
    completion (\\gset)."""
    if variant.table.startswith("reference"):
        script = f"{REFERENCE_CLAIM.text.strip()} \\gset\n{REFERENCE_RELEASE.text.strip()};\n"
    else:
        script = (
            f"WITH claimed AS ({claim_next_statement(variant.claim).text.strip()}) SELECT array_agg(id)::text AS ids, "
            f"array_agg(lease_token)::text AS tokens FROM claimed \\gset\n"
            f"{COMPLETE.text.strip()};\n"
        )
    return script.replace(":owner", "('pgbench-' || :client_id)")


def run_pgbench(url: str, variant: Variant, rows: int, claimers: int, seconds: float) -> float:
    """pgbench runs a fixed number of cycles, chosen so that the table never runs dry."""
    _seed(url, variant.table, rows)
    cycles = max(1, min(int(rows * 0.8) // variant.claim, int(3000 * seconds)) // claimers)
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(_pgbench_script(variant))
        script.flush()
        variables = {"stage": STAGE, "outcome": "null"}
        command = [
            "pgbench", "--no-vacuum", "--protocol=prepared", f"--client={claimers}",
            f"--jobs={min(claimers, 2)}", f"--transactions={cycles}", f"--file={script.name}",
            *(f"--define={k}={v}" for k, v in variables.items()),
            sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True)
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", result.stdout)
    if result.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed:\n{result.stdout}\n{result.stderr}")
    return float(tps.group(1)) * variant.claim


# --- driver ---------------------------------------------------------------------------------------


def _table(title: str, variants, runner, url: str, args) -> None:
    print(f"\n{title}\n")
    print(
        f"| {'rows':>7} | {'claimers':>8} | " + " | ".join(f"{v.name:>15}" for v in variants) + " |"
    )
    print("|" + "---:|" * (len(variants) + 2))
    for rows in args.rows:
        for claimers in args.claimers:
            rates = [
                statistics.median(
                    runner(url, variant, rows, claimers, args.seconds) for _ in range(args.repeats)
                )
                for variant in variants
            ]
            cells = " | ".join(f"{rate:>15,.0f}" for rate in rates)
            print(f"| {rows:>7,} | {claimers:>8} | {cells} |", flush=True)


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
        "--client", choices=["python", "pgbench", "both"], default="both", help="which claimers"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        _, url = fresh_database(args.database_url, Path(tmp), "bench_claims")
        with sa.create_engine(url).connect() as c:
            version = c.execute(sa.text("SHOW server_version")).scalar()
        print(f"PostgreSQL {version}; items claimed and finished per second")
        if args.client in ("python", "both"):
            title = f"Python claimers (processes), {args.seconds:g} s per configuration"
            _table(title, PYTHON_VARIANTS, run_python, url, args)
        if args.client in ("pgbench", "both"):
            if shutil.which("pgbench") is None:
                print("\npgbench is not installed: its table is skipped")
            else:
                title = "pgbench claimers (C clients running the same statements)"
                _table(title, PGBENCH_VARIANTS, run_pgbench, url, args)


if __name__ == "__main__":
    main()
