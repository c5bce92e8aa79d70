"""How fast new catalog rows become Dagster partitions (issue 25, item 2): the real `work` sensor's
ticks, which add each tick's new keys themselves in bulk (`Discovery.add`, through the instance
storage's `add_dynamic_partitions`: the keys as one array parameter), against two baselines in
the same run: the same ticks' keys added by dagster-postgres's own `add_dynamic_partitions` (a
VALUES row per key), and returned as AddDynamicPartitionsRequests and applied as dagster-daemon
applies them (dagster/_daemon/sensor.py `_handle_dynamic_partitions_requests`: a
`has_dynamic_partition` query per key, then one `add_dynamic_partitions` of the missing ones).

    python bench/discovery.py --videos 100000 --baseline-videos 5000

One project using N videos: 2N + 1 partitions (videos, project videos, the project). Dagster's
storage and the claim tables share a scratch database on the given server (bench/databases.py;
the repository's dagster.yaml, as `dagster dev` uses it); it is dropped at the end. Each way runs
in a database of its own; the daemon's on fewer videos (its cost is per key).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from databases import scratch_database  # bench/databases.py
from quiet_tick import fill  # bench/quiet_tick.py

REPO = Path(__file__).resolve().parents[1]


# How a row's keys are added: by the work sensor's tick itself, or the tick's discovery with
# its keys added by dagster-postgres's own statement, or as the daemon applies a sensor's requests.
BY_THE_SENSOR, DAGSTERS_STATEMENT, AS_THE_DAEMON = "sensor", "dagster", "daemon"


def discover_all(url: str, videos: int, adding: str) -> tuple[int, float, int]:
    """(partitions added, seconds, ticks) for every row of a catalog of `videos` videos."""
    import dagster as dg
    from dagster_postgres import PostgresEventLogStorage

    from dataminer_dagster.db.engine import dispose_engines, get_engine
    from dataminer_dagster.definitions import defs
    from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
    from dataminer_dagster.resources.db import DatabaseResource

    engine = get_engine(url)
    fill(engine, videos)
    instance = dg.DagsterInstance.get()
    sensor = defs.resolve_sensor_def("work")
    db = DatabaseResource(database_url=url, data_dir=tempfile.mkdtemp(prefix="dm-discovery-"))
    cursor, ticks, added, seconds = None, 0, 0, 0.0
    while True:  # only the ticks are timed, not the counting between them
        before = _partition_count(engine)
        started = time.perf_counter()
        if adding != BY_THE_SENSOR:  # the tick's discovery, its keys added the baseline's way
            found = plan_discovery(engine, DiscoveryCursor.parse(cursor), instance=instance)
            for name, keys in found.additions.items():
                if adding == AS_THE_DAEMON:
                    missing = [k for k in keys if not instance.has_dynamic_partition(name, k)]
                    if missing:
                        instance.add_dynamic_partitions(name, missing)
                else:
                    PostgresEventLogStorage.add_dynamic_partitions(
                        instance.event_log_storage, name, keys
                    )
            cursor = found.cursor.dump()
        else:
            with dg.build_sensor_context(
                instance=instance, cursor=cursor, resources={"db": db}
            ) as context:
                result = sensor(context)
            cursor = result.cursor if isinstance(result, dg.SensorResult) else cursor
        seconds += time.perf_counter() - started
        count = _partition_count(engine) - before
        if not count:
            break
        ticks += 1
        added += count
    instance.dispose()
    dispose_engines()
    return added, seconds, ticks


def _partition_count(engine) -> int:
    """Dagster's dynamic partitions, counted in its table (the same database)."""
    import sqlalchemy as sa

    with engine.connect() as c:
        return c.execute(sa.text("SELECT count(*) FROM dynamic_partitions")).scalar_one()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=100_000)
    parser.add_argument("--baseline-videos", type=int, default=5_000)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    rows = []
    for label, videos, adding in (
        ("the work sensor, keys added in bulk by the tick", args.videos, BY_THE_SENSOR),
        ("the ticks' keys added by dagster-postgres's statement", args.videos, DAGSTERS_STATEMENT),
        ("the ticks' keys applied as dagster-daemon does", args.baseline_videos, AS_THE_DAEMON),
    ):
        with (
            scratch_database(args.database_url, "bench_discovery") as url,
            tempfile.TemporaryDirectory(prefix="dataminer-bench-") as home,
        ):
            shutil.copy(REPO / "dagster.yaml", Path(home) / "dagster.yaml")
            os.environ.update(DAGSTER_HOME=home, DATAMINER_DATABASE_URL=url)
            added, seconds, ticks = discover_all(url, videos, adding)
        rows.append((label, added, seconds, ticks))
        print(
            f"{label}: {added:,} partitions in {seconds:.1f} s over {ticks} ticks = "
            f"{added / seconds:,.0f} keys/s"
        )
    rate = {label: added / seconds for label, added, seconds, _ in rows}
    ours = rate[rows[0][0]]
    print(
        f"the sensor against dagster-postgres's statement: {ours / rate[rows[1][0]]:.1f}x, "
        f"against the daemon's way: {ours / rate[rows[2][0]]:.1f}x; "
        f"load average at the end: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
