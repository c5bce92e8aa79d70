"""A prompt change on a finished project: the filter done again from the embedding cache, against
the first filter pass, in one command.

A project of `--videos` synthetic clips (4 s each, one frame every 0.5 s: 8 frames a video) is
driven to complete as `dataminer run` drives it, with a SigLIP of the real ViT-B/16 224 image
tower and random weights (nothing is downloaded; the speed is the architecture's). Then its
config is registered again with other prompts and a higher threshold, and driven again. The
figure is the filter stage's own time (the sum over its items of finished_at - started_at, from
the claim tables), first pass against the second; the frames each pass embedded with the model
are counted too (the second pass: none). Goal: the second pass >= 20x faster.

    python bench/refilter.py                       # 100 videos, embedded PostgreSQL
    python bench/refilter.py --videos 10           # smoke run
    python bench/refilter.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))


def filter_pass(engine: sa.Engine) -> tuple[float, int, int]:
    """(seconds of filter work, items, frames the model embedded) of the last pass."""
    with engine.connect() as c:
        row = c.execute(
            sa.text("""SELECT sum(extract(epoch FROM finished_at - started_at)) AS seconds,
                              count(*) AS items, sum((outcome ->> 'embedded')::int) AS embedded
                         FROM dataminer.work_items WHERE stage = 'filter' AND status = 'done'""")
        ).one()
    return float(row.seconds), int(row.items), int(row.embedded or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--videos", type=int, default=100)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    from databases import scratch_home

    with scratch_home(args.database_url, "bench-refilter") as root:
        run(args.videos, root)


def run(videos: int, root: Path) -> None:
    import dagster as dg

    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.definitions import LANES, defs
    from dataminer_dagster.engine.planning import RunLimits
    from dataminer_dagster.hosting.driver import drive
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    engine = get_engine(os.environ["DATAMINER_DATABASE_URL"])
    store = LeaseStore(engine, settings.retry)
    catalog = Catalog(engine, store, DataPaths(settings.data_dir))
    model = build_tiny_siglip(root / "siglip-b16", vision_preset="base-patch16-224")
    clips = [
        str(
            write_opencv_video(
                root / "videos" / f"clip{i:03d}.mp4",
                SyntheticVideoSpec(width=320, height=240, fps=10, seconds=4.0, seed=i),
            )
        )
        for i in range(videos)
    ]
    raw = {
        "name": "refilter",
        "output_dir": str(root / "out"),
        "inputs": {"files": clips},
        "extract": {"strategy": "time", "every_seconds": 0.5},
        "filter": {
            "model": str(model),
            "device": "cpu",
            "positive_prompts": ["a moving shape"],
            "positive_threshold": 0.0,
        },
    }

    def drive_to_complete() -> float:
        started = time.monotonic()
        result = drive(
            ["refilter"],
            instance=instance,
            defs=defs,
            store=store,
            limits=RunLimits(settings.lease, settings.runs),
            log=lambda line: None,
            lanes=LANES,
        )
        assert result.stages == {"refilter": "complete"}, result
        return time.monotonic() - started

    with dg.instance_for_test() as instance:
        catalog.projects.register(parse_project_config(raw))
        first_wall = drive_to_complete()
        first = filter_pass(engine)
        raw["filter"] = {
            **raw["filter"],
            "positive_prompts": ["a red square", "a circle"],
            "positive_threshold": 0.5,
        }
        changed = catalog.projects.register(parse_project_config(raw))
        second_wall = drive_to_complete()
        second = filter_pass(engine)

    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_CORETYPE")}
    import torch

    print(f"videos: {videos}; torch threads: {torch.get_num_threads()}; env: {threads}")
    print(
        f"changed: {', '.join(changed.changed_keys)}; runs again: {', '.join(changed.stale_stages)}"
    )
    print(
        f"first filter pass:  {first[0]:8.2f} s over {first[1]} items, {first[2]} frames embedded "
        f"(project to complete: {first_wall:.1f} s)"
    )
    print(
        f"second filter pass: {second[0]:8.2f} s over {second[1]} items, {second[2]} frames embedded "
        f"(project to complete: {second_wall:.1f} s)"
    )
    print(f"ratio: {first[0] / second[0]:.1f}x (goal >= 20x)")


if __name__ == "__main__":
    main()
