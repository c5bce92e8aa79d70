"""What the Dagster UI can show of a catalog of N videos (issue 25, item 4), in one command.

For each of `--sizes`, a fresh database on the local PostgreSQL 15: one project linking N videos
through `Catalog.link_and_queue` and the work sensor's discovery until every row is a partition
(as bench/scale.py fills it), then `dagster-webserver` on the repository's workspace and
dagster.yaml, and the webserver's GraphQL as the UI's pages call it (each a median of
`--repeats`, with the size of its answer):

* **asset graph**: every asset's partition counts (`partitionStats`, what the graph and the
  asset list show beside each asset);
* **Partitions tab** of `downloads` (a partition per video) and of `filtered_frames` (a partition
  per project video): `assetPartitionStatuses`, the keys by status;
* **a project's page**: the Partitions tab of `deduped_set` (a partition per project), and one
  video partition's latest materialization (what a link to that partition loads);

and the webserver's resident memory (with its code server) after them.

    python bench/ui_scale.py                            # 10,000 and 100,000 videos
    python bench/ui_scale.py --sizes 1000000 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from databases import catalog_home  # bench/databases.py
from scale import link, report, scale_project  # bench/scale.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.graphql import PARTITION_STATUSES, call  # noqa: E402
from tests.helpers.ui_demo import webserver  # noqa: E402

PARTITION_STATS = """
query Stats {
  assetNodes { assetKey { path } partitionStats { numMaterialized numPartitions numFailed } }
}
"""
ONE_PARTITION = """
query One($key: AssetKeyInput!, $partitions: [String!]) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode { assetMaterializations(partitions: $partitions, limit: 1) { runId } }
  }
}
"""


def fill(url: str, home: Path, size: int) -> None:
    """One project of `size` videos, every row a partition (as the work sensor leaves it)."""
    import dagster as dg

    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
    from dataminer_dagster.paths import DataPaths

    engine = get_engine(url)
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(home / "data"))
    project = scale_project(catalog, home)
    link(catalog, project, 0, size, 10_000)
    instance = dg.DagsterInstance.get()
    cursor = DiscoveryCursor()
    while (found := plan_discovery(engine, cursor, instance=instance)).count:
        found.apply(instance)
        cursor = found.cursor
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.exec_driver_sql("ANALYZE")
    instance.dispose()


def timed(base: str, query: str, variables: dict, repeats: int) -> tuple[float, int]:
    """(median seconds, bytes of the answer)."""
    times, size = [], 0
    for _ in range(repeats):
        started = time.perf_counter()
        answer = call(base, query, variables)
        times.append(time.perf_counter() - started)
        size = len(json.dumps(answer))
    return statistics.median(times), size


def resident_mb(port: int) -> float:
    """Resident memory of the webserver listening on `port` and its children (the code server)."""
    pids = subprocess.run(
        ["pgrep", "-f", f"dagster-webserver.*-p {port}"], capture_output=True, text=True
    ).stdout.split()
    total = 0
    for pid in pids:
        tree = subprocess.run(
            ["ps", "-o", "rss=", "--ppid", pid, "-p", pid], capture_output=True, text=True
        ).stdout.split()
        total += sum(int(kb) for kb in tree)
    return total / 1024


def measure(url: str, home: Path, size: int, repeats: int) -> dict[str, float]:
    figures: dict[str, float] = {}
    started = time.perf_counter()
    fill(url, home, size)
    figures["fill_and_discover_s"] = time.perf_counter() - started
    env = {
        "DAGSTER_HOME": str(home),
        "DATAMINER_HOME": str(home),
        "DATAMINER_DATABASE_URL": url,
    }
    with webserver(env, timeout_s=600) as base:
        figures["graph_s"], figures["graph_bytes"] = timed(base, PARTITION_STATS, {}, repeats)
        for asset in ("downloads", "filtered_frames", "deduped_set"):
            seconds, size_bytes = timed(
                base, PARTITION_STATUSES, {"key": {"path": [asset]}}, repeats
            )
            figures[f"{asset}_partitions_s"], figures[f"{asset}_partitions_bytes"] = (
                seconds,
                size_bytes,
            )
        figures["one_video_s"], _ = timed(
            base,
            ONE_PARTITION,
            {"key": {"path": ["downloads"]}, "partitions": ["v00000001"]},
            repeats,
        )
        figures["webserver_rss_mb"] = resident_mb(int(base.rsplit(":", 1)[1]))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    results = {}
    for size in args.sizes:
        with catalog_home(args.database_url, "bench_ui") as (url, home):
            before = os.getloadavg()[0]
            figures = measure(url, home, size, args.repeats)
            figures["load_before"], figures["load_after"] = before, os.getloadavg()[0]
        results[size] = figures
        print(f"{size:,} videos: " + json.dumps({k: round(v, 2) for k, v in figures.items()}))
    report(results, "ui_scale", digits=2)


if __name__ == "__main__":
    main()
