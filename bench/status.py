"""`dataminer status` on a catalog of 10k, 100k and 1M videos (issue 25, item 3).

Each size is a fresh database on the given PostgreSQL, holding one project whose N videos have
their download and extraction done and their filter queued, beside a second project of 20 videos
(tests/helpers/catalog_seed.py: `generate_series`, not the catalog stage), their progress then
copied onto their links as the work sensor's ticks copy it (db/link_progress.py), the copies' old
row versions vacuumed as autovacuum would. Measured: the real
`dataminer status` and `dataminer status --json` commands (subprocesses, wall time, Python start
included), `dataminer status big` and `status small` (a project's own: its work, yield,
frames, failures; the big project's videos read in one pass, db/video_totals.py, timed alone
too), and in the same run the per-project count statement as the product sends it against
the statement it replaced (an `OR ... IN (subquery)`), with a statement timeout.

    python bench/status.py --database-url postgresql://postgres@127.0.0.1:5432/postgres \
        [--sizes 10000 100000 1000000] [--old-timeout-s 120]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.catalog_seed import add_project, seed_videos  # noqa: E402

OLD_STAGE_COUNTS = """
    SELECT w.stage, w.status, count(*) FROM dataminer.work_items w
     WHERE w.project_id = :p
        OR (w.stage = ANY(ARRAY['download', 'frames'])
            AND w.video_id IN (SELECT video_id FROM dataminer.project_videos WHERE project_id = :p))
     GROUP BY 1, 2"""


def timed_command(env: dict, *args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dataminer"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"dataminer {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return elapsed


def timed_statement(engine: sa.Engine, statement: str, params: dict, timeout_s: float) -> str:
    with engine.connect() as c:
        c.execute(sa.text(f"SET statement_timeout = {int(timeout_s * 1000)}"))
        started = time.perf_counter()
        try:
            c.execute(sa.text(statement), params).all()
        except sa.exc.OperationalError:
            return f"> {timeout_s:g} s (cancelled)"
        return f"{time.perf_counter() - started:.3f} s"


def measure(admin_url: str, size: int, old_timeout_s: float) -> dict[str, str]:
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.link_progress import copy_link_progress
    from dataminer_dagster.db.reports import stage_counts
    from dataminer_dagster.db.video_totals import video_totals
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.testing import ScratchPostgres, environment_for

    server = ScratchPostgres(admin_url)
    name = server.new_database()
    home = Path(tempfile.mkdtemp(prefix="dm-status-bench-"))
    try:
        url = server.url(name)
        engine = get_engine(url)
        catalog = Catalog(engine, LeaseStore(engine), DataPaths(home / "data"))
        big, small = add_project(catalog, "big"), add_project(catalog, "small")
        started = time.perf_counter()
        seed_videos(engine, big, size, "b")
        seed_videos(engine, small, 20, "s")
        seeded_s = time.perf_counter() - started
        started = time.perf_counter()  # the seeded videos' progress onto their links, as ticks do
        while copy_link_progress(engine):
            pass
        copied_s = time.perf_counter() - started
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("VACUUM ANALYZE dataminer.project_videos, dataminer.video_changes")
        env = {**os.environ, **environment_for(url, home), "DAGSTER_HOME": str(home / "dagster")}
        (home / "dagster").mkdir(parents=True)
        figures = {"seeded in": f"{seeded_s:.0f} s", "copied in": f"{copied_s:.0f} s"}
        figures["status"] = f"{timed_command(env, 'status'):.2f} s"
        figures["status --json"] = f"{timed_command(env, 'status', '--json'):.2f} s"
        for project in ("big", "small"):
            figures[f"status {project}"] = f"{timed_command(env, 'status', project):.2f} s"
        with engine.connect() as c:
            started = time.perf_counter()
            video_totals(c, big, ("download", "frames"), 15)
        figures["videos' pass (big)"] = f"{time.perf_counter() - started:.3f} s"
        started = time.perf_counter()
        stage_counts(engine, big)
        figures["stage counts (big)"] = f"{time.perf_counter() - started:.3f} s"
        started = time.perf_counter()
        stage_counts(engine, small)
        figures["stage counts (small)"] = f"{time.perf_counter() - started:.3f} s"
        for label, project in (("big", big), ("small", small)):
            figures[f"old statement ({label})"] = timed_statement(
                engine, OLD_STAGE_COUNTS, {"p": project}, old_timeout_s
            )
        engine.dispose()
        return figures
    finally:
        server.drop(name)
        server.close()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="an admin URL of a PostgreSQL")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--old-timeout-s", type=float, default=120)
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    rows = {}
    for size in args.sizes:
        rows[size] = measure(args.database_url, size, args.old_timeout_s)
        print(f"{size:,} videos: {rows[size]}", flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    columns = list(next(iter(rows.values())))
    print("\n| videos | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for size, figures in rows.items():
        print(f"| {size:,} | " + " | ".join(figures[c] for c in columns) + " |")


if __name__ == "__main__":
    main()
