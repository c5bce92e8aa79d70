"""Downloads against a host's allowance: how much of it the pipeline uses, and whether it keeps
asking once the host said stop.

A local host (tests/helpers/throttling_host.py) serves tiny videos and allows `--allowance`
requests per window of `--window` seconds (default 60 per 60 s); beyond that it answers 429 with
Retry-After = the seconds to the window's end. Three download runs (the video lane's default share,
each in its own process, with the real Dagster job, yt-dlp and claim database) download
`--videos` videos, enough to keep asking for more than the allowance in every window.

* **Share of the allowance**: requests the host served per window, over the allowance, in every
  window but the last (where the work runs out); also videos per minute against the allowance's
  videos per minute (two requests per video: the watch page, then the stream).
* **Refused after the first refusal of a window**: requests the host received in a window after
  it had refused one there (a client that honours Retry-After across runs sends none).
* **Throttle overhead**: the claim-database work of one download (a download slot taken and given
  back, two request turns), measured on its own in this process.

    python bench/downloads.py                                  # embedded PostgreSQL in a temp dir
    python bench/downloads.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
    python bench/downloads.py --allowance 10 --window 10 --videos 60   # quicker, same shape
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RUNS = 3


def _project(url: str, data_dir: Path, video_urls: list[str]) -> list[str]:
    """A project of these URLs, linked and queued as its catalog run would; its video ids."""
    from dataminer_dagster.assets.catalog.inputs import collect_candidates
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.paths import DataPaths

    config = parse_project_config(
        {
            "name": "bench",
            "inputs": {"urls": video_urls},
            "download": {
                "allow_private_networks": True,  # served on 127.0.0.1
                "max_downloads_per_host": 2,
                "max_pause_wait_s": 600,  # every pause is waited out in the runs
                "sleep_interval_s": 0,
                "sleep_requests_s": 0,
            },
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    engine = get_engine(url)
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
    project = catalog.projects.register(config).project
    found = collect_candidates(config.inputs, search=None)
    with engine.begin() as conn:
        catalog.link_and_queue(conn, project, found.candidates)
    return [c.video_id for c in found.candidates]


def _download(url: str, data_dir: Path, keys: list[str], tmp: Path) -> float:
    """Three download runs at once, each in its own process; seconds until all ended."""
    from dataminer_dagster.partitions import videos_partitions
    from dataminer_dagster.registry import DOWNLOAD
    from tests.helpers.processes import run_batches_at_once

    started = time.monotonic()
    ended = run_batches_at_once(
        DOWNLOAD,
        videos_partitions.name,
        [keys[n::RUNS] for n in range(RUNS)],
        database_url=url,
        data_dir=data_dir,
        work_dir=tmp,
        timeout_s=3600,
    )
    for done in ended:
        if not (done.result and done.result["success"]):
            raise SystemExit(f"a download run failed:\n{done.output[-3000:]}")
    return time.monotonic() - started


def _overhead(url: str, rounds: int) -> float:
    """Milliseconds of claim-database work per download: a slot taken and given back, two
    request turns (the requests of a direct video), a run heartbeat in place."""
    from dataminer_dagster.acquisition.politeness import PausePolicy
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.shared_throttle import SharedThrottle

    engine = get_engine(url)
    LeaseStore(engine).liveness.heartbeat("bench-overhead", "bench", os.getpid())
    throttle = SharedThrottle(
        engine, run_id="bench-overhead", policy=PausePolicy(), stale_after_s=120
    )
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        with throttle.download_slot("overhead.example", 2):
            for _request in range(2):
                with throttle.request_turn("overhead.example") as turn:
                    turn.succeeded()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    from databases import fresh_database  # bench/databases.py

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", help="a server to create a throw-away database on")
    parser.add_argument("--allowance", type=int, default=60, help="requests per window")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    parser.add_argument("--videos", type=int, default=150)
    parser.add_argument("--overhead-rounds", type=int, default=300)
    args = parser.parse_args()

    from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
    from tests.helpers.throttling_host import ThrottlingHost, write_videos

    tmp = Path(tempfile.mkdtemp(prefix="bench-downloads-"))
    admin, url = fresh_database(args.database_url, tmp, "bench_downloads")
    data_dir = tmp / "data"
    os.environ.update(
        DATAMINER_HOME=str(tmp / "home"),
        DATAMINER_DATABASE_URL=url,
        DATAMINER_DATA_DIR=str(data_dir),
    )
    root = tmp / "www"
    names = [f"v{n}" for n in range(args.videos)]
    write_videos(
        root, names, write_opencv_video(tmp / "clip.mp4", SyntheticVideoSpec(64, 48, 5.0, 1.0))
    )
    try:
        with ThrottlingHost(root, allowance=args.allowance, window_s=args.window) as host:
            keys = _project(url, data_dir, [host.page_url(n) for n in names])
            elapsed = _download(url, data_dir, keys, tmp)
            served = host.served_per_window()
            stats = host.stats
        overhead_ms = _overhead(url, args.overhead_rounds)
        _report(args, served, stats, elapsed, overhead_ms)
    finally:
        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()
        name = sa.engine.make_url(url).database
        with sa.create_engine(admin, isolation_level="AUTOCOMMIT").connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        shutil.rmtree(tmp, ignore_errors=True)


def _report(args, served: list[int], stats, elapsed: float, overhead_ms: float) -> None:
    full = served[:-1] or served
    share = sum(full) / (args.allowance * len(full))
    per_minute = 60 / args.window
    videos_per_minute = args.videos / (len(served) * args.window) * 60  # over the windows used
    print(
        f"host allowance: {args.allowance} requests per {args.window:g} s "
        f"({args.allowance * per_minute:g}/min); {args.videos} videos, {RUNS} download runs, "
        f"max_downloads_per_host 2"
    )
    print(f"requests served per window: {served}")
    print(
        f"share of the allowance (every window but the last): {share:.3f}x "
        f"({sum(full)} of {args.allowance * len(full)})"
    )
    print(
        f"videos per minute over the {len(served)} windows used: {videos_per_minute:.1f} "
        f"(the allowance's: {args.allowance * per_minute / 2:g}); runs took {elapsed:.0f} s"
    )
    print(
        f"refused: {stats.refused} in {stats.refused_windows} windows; after the first refusal "
        f"of a window: {stats.requests_during_pause}"
    )
    print(f"most videos transferring at once: {stats.max_videos_at_once}")
    print(
        f"throttle overhead per download (slot + 2 request turns): {overhead_ms:.2f} ms "
        f"(median of {args.overhead_rounds})"
    )


if __name__ == "__main__":
    main()
