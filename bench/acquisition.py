"""Benchmark acquisition toward a target (issue 27, item 4): downloads needed to reach
`target.images` when a round takes the new videos of the sources with the best yield so far
(`target.order: yield`, assets/catalog/source_choice.py) against taking them in the order the sources are
listed (`target.order: listed`), on the real pipeline, in one run.

The stand-in sources are RSS feeds on 127.0.0.1 read by real yt-dlp, whose clips have known
yields: with frames every 0.5 s and dedup at 0.99999 (the tiny random model keeps nearly every
frame), a clip of s seconds keeps about 2s frames. The feeds are listed worst first, as a user
who does not know their yields might list them. Each order runs the same project (tiny random
SigLIP2, in-process `dataminer run` loop) on a fresh database; both must end `reached` with every
asset check passing. `--best-first` lists the feeds best first instead: list order is then the
best order there is, and the run measures what exploring costs.

    python bench/acquisition.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# seconds per clip of each feed, worst yield first: 1, 2, 4 and 12 frames kept per video
FEEDS = {"half": 0.5, "one": 1.0, "two": 2.0, "six": 6.0}
CLIPS_PER_FEED = 24


def write_feeds(server, root: Path, best_first: bool) -> list[str]:
    from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video

    urls = []
    for f, (name, seconds) in enumerate(FEEDS.items()):
        items = []
        for i in range(CLIPS_PER_FEED):
            clip = f"{name}{i:02d}.mp4"
            spec = SyntheticVideoSpec(
                width=64, height=48, fps=10, seconds=seconds, seed=100 * f + i
            )
            write_opencv_video(root / clip, spec)
            items.append(f"<item><title>{clip}</title><link>{server.url('/' + clip)}</link></item>")
        (root / f"{name}.xml").write_text(
            '<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>'
            f"<link>{server.url('/')}</link><description>d</description>{''.join(items)}"
            "</channel></rss>"
        )
        urls.append(server.url(f"/{name}.xml"))
    return urls[::-1] if best_first else urls


def run(admin_url: str, feeds: list[str], siglip: Path, order: str, target: int) -> dict:
    import dagster as dg
    import sqlalchemy as sa

    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.testing import ScratchPostgres, keep_every_frame
    from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources

    server = ScratchPostgres(admin_url)
    name = server.new_database()
    home = Path(tempfile.mkdtemp(prefix=f"dm-acquisition-{order}-"))
    try:
        url = server.url(name)
        engine = get_engine(url)
        catalog = Catalog(engine, LeaseStore(engine), DataPaths(home / "data"))
        catalog.projects.register(
            parse_project_config(
                {
                    "name": "aims",
                    "output_dir": str(home / "out"),
                    "inputs": {"listings": feeds, "max_per_listing": 3},
                    "download": {"allow_private_networks": True},  # served on 127.0.0.1
                    "target": {"images": target, "order": order},
                    "extract": {"strategy": "time", "every_seconds": 0.5},
                    "filter": keep_every_frame(siglip, ["a shape"]),
                    "dedup": {"threshold": 0.99999},
                }
            )
        )
        defs = pipeline_definitions(resources(url, home / "data"))
        started = time.perf_counter()
        with dg.instance_for_test() as instance:
            result = drive_quietly(
                ["aims"], instance=instance, defs=defs, store=LeaseStore(engine), timeout_s=3600
            )
            checks = [
                record.status.value
                for key in defs.resolve_asset_graph().asset_check_keys
                for record in instance.event_log_storage.get_asset_check_execution_history(
                    key, limit=1000
                )
            ]
        seconds = time.perf_counter() - started
        with engine.connect() as c:
            state = c.execute(sa.text("SELECT acquisition FROM dataminer.projects")).scalar_one()
            downloads = c.execute(
                sa.text("""SELECT count(*) FROM dataminer.work_items
                            WHERE stage = 'download' AND status = 'done'""")
            ).scalar_one()
            per_feed = dict(
                c.execute(
                    sa.text("""SELECT regexp_replace(video_id, '[0-9]+-.*$', ''), count(*)
                                 FROM dataminer.project_videos GROUP BY 1""")
                ).all()
            )
            images = c.execute(
                sa.text("""SELECT (outcome ->> 'images')::int FROM dataminer.work_items
                            WHERE stage = 'dataset'""")
            ).scalar_one()
        engine.dispose()
        return {
            "order": order,
            "stage": result.stages["aims"],
            "state": f"{state['state']} (round {state['round']})",
            "downloads": downloads,
            "per feed": per_feed,
            "images": images,
            "checks": f"{checks.count('SUCCEEDED')} of {len(checks)} succeeded",
            "seconds": round(seconds),
        }
    finally:
        server.drop(name)
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="an admin URL of a PostgreSQL")
    parser.add_argument("--target", type=int, default=120)
    parser.add_argument(
        "--best-first",
        action="store_true",
        help="List the feeds best yield first (list order is then the best order there is).",
    )
    args = parser.parse_args()
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from tests.helpers.http_server import LocalHTTPServer

    print(f"load average at the start: {os.getloadavg()}")
    root = Path(tempfile.mkdtemp(prefix="dm-acquisition-www-"))
    siglip = build_tiny_siglip(root.parent / f"{root.name}-siglip")
    with LocalHTTPServer(root) as server:
        feeds = write_feeds(server, root, args.best_first)
        rows = [
            run(args.database_url, feeds, siglip, order, args.target)
            for order in ("listed", "yield")
        ]
    for row in rows:
        print(row)
    listed, best = rows[0]["downloads"], rows[1]["downloads"]
    print(
        f"target {args.target} images: {best} downloads by yield against {listed} in list order "
        f"({1 - best / listed:.0%} fewer); load average at the end: {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
