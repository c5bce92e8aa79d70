"""What a new code server's first evaluation of the work sensor costs beside its later ones.

A standalone `dagster-daemon` replaces the code servers it started every 60 s, and the longest of
its work ticks came about then (bench/README.md, "Scale"). This starts real `dagster api grpc`
servers on the repository's definitions one after another, as the daemon starts them, and
evaluates the work sensor through each as the daemon asks it (`get_sensor_execution_data`, the
cursor carried from one evaluation to the next, nothing new in the catalog after the first):
the time of each evaluation, the server's start, and the load average.

    python bench/first_evaluation.py [--videos 2000] [--servers 4] [--evaluations 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from databases import catalog_home  # bench/databases.py
from scale import link, scale_project  # bench/scale.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def evaluations(servers: int, count: int) -> list[tuple[float, list[float]]]:
    """(seconds to a served location, [ms of each evaluation]) per server, in turn."""
    import dagster as dg
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._grpc.server import GrpcServerProcess

    instance = dg.DagsterInstance.get()
    target = LoadableTargetOrigin(
        module_name="dataminer_dagster.definitions", working_directory=str(REPO)
    )
    cursor, found = None, []
    for _ in range(servers):
        started = time.perf_counter()
        server = GrpcServerProcess(
            instance_ref=instance.get_ref(),
            location_name="dataminer",
            loadable_target_origin=target,
            wait_on_exit=True,
        )
        try:
            origin = GrpcServerCodeLocationOrigin(
                host="localhost", port=server.port, socket=server.socket, location_name="dataminer"
            )
            with origin.create_location(instance) as location:
                ready_s = time.perf_counter() - started
                handle = next(iter(location.get_repositories().values())).handle
                times = []
                for _ in range(count):
                    began = time.perf_counter()
                    data = location.get_sensor_execution_data(
                        instance, handle, "work", None, None, cursor, None, None
                    )
                    times.append((time.perf_counter() - began) * 1000)
                    cursor = data.cursor
                    time.sleep(0.5)  # the daemon's ticks are a second apart
            found.append((ready_s, times))
        finally:
            server.shutdown_server()
            server.wait()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=2_000)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--evaluations", type=int, default=5)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    with catalog_home(args.database_url, "first_eval") as (url, home):
        from dataminer_dagster.db.catalog import Catalog
        from dataminer_dagster.db.engine import get_engine
        from dataminer_dagster.db.leases import LeaseStore
        from dataminer_dagster.paths import DataPaths

        engine = get_engine(url)
        catalog = Catalog(engine, LeaseStore(engine), DataPaths(home / "data"))
        link(catalog, scale_project(catalog, home), 0, args.videos, 10_000)
        print(f"load average before: {os.getloadavg()}", flush=True)
        # The first server's first evaluation discovers the catalog: not counted below.
        found = evaluations(args.servers + 1, args.evaluations)[1:]
        print(f"load average after: {os.getloadavg()}")
    for n, (ready_s, times) in enumerate(found, 1):
        print(
            f"server {n}: served after {ready_s:.1f} s; evaluations ms: "
            + " ".join(f"{t:.0f}" for t in times)
        )
    first = [times[0] for _, times in found]
    later = [t for _, times in found for t in times[1:]]
    print(
        f"first evaluation of a server: median {statistics.median(first):.1f} ms "
        f"({min(first):.0f}-{max(first):.0f}); later ones: median "
        f"{statistics.median(later):.1f} ms ({min(later):.0f}-{max(later):.0f})"
    )


if __name__ == "__main__":
    main()
