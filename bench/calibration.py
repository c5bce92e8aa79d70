"""How close `dataminer calibrate` comes to the threshold that truly reaches a precision, over
many draws of its sample, on a project over the synthetic world filtered by the shipped world
SigLIP.

The project (the world of `--world-seed`, one frame every 0.2 s, the prompts "a <colour>
<shape>" for the world's four shapes) is driven to complete as `dataminer run` drives it. Its
frames' truth is the world's: a frame is a yes when it shows an object of that colour. Then, for
each sample size and precision asked, `--draws` samples are drawn (seeds 0, 1, ...) and
answered from the truth, and the threshold that `calibrate` recommends (the same functions:
scored_frames, draw_sample, choose_threshold) is set against the lowest threshold at which the
project's frames truly reach that precision. Reported per row: the share of draws within 0.05 of
it, the median distance, the share within 0.05 of a baseline that estimates precision from the
answered frames alone (each weighing as the frames of its stratum, thresholds only between
answered scores), how often the precision interval printed for the recommended threshold holds
the precision it truly gives, and that true precision. Then the same draws with `--more`
frames added as `dataminer calibrate export --more --precision P` adds them (allocate_more,
draw_more: where they narrow the precision estimate at the threshold recommended so far), set
against a sample of as many frames drawn at once.

    python bench/calibration.py                          # embedded PostgreSQL
    python bench/calibration.py --database-url postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

WITHIN = 0.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-seed", type=int, default=4401)
    parser.add_argument("--colour", default="red")
    parser.add_argument("--frames", type=int, nargs="+", default=[48, 96])
    parser.add_argument("--precision", type=float, nargs="+", default=[0.9, 0.95])
    parser.add_argument("--more", type=int, default=48, help="frames added to each sample")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()

    from databases import scratch_home

    with scratch_home(args.database_url, "bench-calibration") as root:
        frames = filtered_world(root, args.world_seed, args.colour)
    print(
        f"world {args.world_seed}, prompts 'a {args.colour} <shape>': {len(frames)} frames, "
        f"{int(frames['yes'].sum())} show a {args.colour} object; {args.draws} draws a row"
    )
    print(
        f"{'frames':>6} {'precision':>9} {'truly':>6}  {'within ' + str(WITHIN):>11} "
        f"{'median |d|':>10}  {'answers only':>12}  {'in interval':>11}  "
        f"{'+' + str(args.more) + ' more':>9} {'in interval':>11}  "
        "true precision of the recommended: median (min-max)"
    )
    for size in args.frames:
        for precision in args.precision:
            row(frames, size, precision, args.draws, args.more)


def filtered_world(root: Path, seed: int, colour: str):
    """The world's project driven to complete: its scored frames, each with its truth."""
    import dagster as dg
    import pandas as pd

    from dataminer_dagster.assets.filter.store import filtered_videos
    from dataminer_dagster.assets.filter.table import scored_frames
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.core.world import load_world, plan_world, write_world
    from dataminer_dagster.core.world_render import SHAPES
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.definitions import LANES, defs
    from dataminer_dagster.engine.planning import RunLimits
    from dataminer_dagster.hosting.driver import drive
    from dataminer_dagster.models.world_models import WORLD_SIGLIP
    from dataminer_dagster.paths import DataPaths, ProjectPaths
    from dataminer_dagster.settings import load_settings

    write_world(root / "world", plan_world(seed))
    world = load_world(root / "world")
    settings = load_settings()
    engine = get_engine(os.environ["DATAMINER_DATABASE_URL"])
    store = LeaseStore(engine, settings.retry)
    catalog = Catalog(engine, store, DataPaths(settings.data_dir))
    raw = {
        "name": "calibration",
        "output_dir": str(root / "out"),
        "inputs": {"files": sorted({str(root / "world" / p) for p in world.truths})},
        "extract": {"strategy": "time", "every_seconds": 0.2},
        "filter": {
            "model": str(WORLD_SIGLIP),
            "device": "cpu",
            "positive_prompts": [f"a {colour} {shape}" for shape in SHAPES],
        },
    }
    with dg.instance_for_test() as instance:
        catalog.projects.register(parse_project_config(raw))
        result = drive(
            ["calibration"],
            instance=instance,
            defs=defs,
            store=store,
            limits=RunLimits(settings.lease, settings.runs),
            log=lambda line: None,
            lanes=LANES,
        )
    assert result.stages == {"calibration": "complete"}, result
    project = catalog.projects.get("calibration")
    frames = scored_frames(project, filtered_videos(engine, project.id))
    paths = ProjectPaths(project.output_dir)
    videos = catalog.videos.get(sorted(set(frames["video_id"])))
    yes = []
    for video_id, part in frames.groupby("video_id", sort=False):
        table = pd.read_parquet(paths.filter_table(video_id)).set_index("frame_index")
        truth = world.truth_for(videos[video_id].source_path)
        yes += [
            any(o.colour == colour for o in truth.at(t).objects)
            for t in table.loc[part["frame_index"], "timestamp"]
        ]
    return frames.assign(yes=yes)


def truly_reaching(frames, precision: float) -> float:
    scores = frames["pos_max"].to_numpy(np.float32)
    allowed = frames["rule_allows"].to_numpy()
    yes = frames["yes"].to_numpy()
    for t in np.unique(scores):
        kept = allowed & (scores > t)
        if kept.any() and yes[kept].mean() >= precision:
            return float(t)
    raise SystemExit(f"no threshold reaches precision {precision} on this world")


def row(frames, size: int, precision: float, draws: int, more: int) -> None:
    from dataminer_dagster.assets.filter.calibration import (
        Answers,
        aim_more,
        allocate_more,
        choose_threshold,
        draw_more,
        draw_sample,
    )

    scores = frames["pos_max"].to_numpy(np.float32)
    allowed = frames["rule_allows"].to_numpy()
    yes = frames["yes"].to_numpy()
    truly = truly_reaching(frames, precision)

    def answered(sample, drawn):
        return Answers(
            sample.strata,
            sample.population_strata[drawn],
            scores[drawn],
            allowed[drawn],
            yes[drawn],
            scores[allowed],
            sample.population_strata[allowed],
        )

    def judged(answers, distance, reached, held):
        chosen = choose_threshold(answers, precision).estimate
        if chosen is None:
            distance.append(np.inf)
            return
        distance.append(abs(chosen.threshold - truly))
        kept = allowed & (scores > np.float32(chosen.threshold))
        reached.append(yes[kept].mean() if kept.any() else np.nan)
        low, high = chosen.precision_interval
        held.append(low <= reached[-1] <= high)

    distance, baseline, reached, held = [], [], [], []
    distance_more, reached_more, held_more = [], [], []
    for seed in range(draws):
        sample = draw_sample(scores, frames["best_positive"].to_numpy(), size, seed)
        answers = answered(sample, sample.frames)
        baseline.append(abs(answers_only(answers, precision) - truly))
        judged(answers, distance, reached, held)
        drawn = np.bincount(sample.stratum_of, minlength=len(sample.strata))
        aim = aim_more(answers, precision)
        counts = allocate_more(answers, drawn, more, aim.threshold if aim else None)
        added, _ = draw_more(sample.population_strata, sample.frames, counts, [seed, size])
        judged(
            answered(sample, np.concatenate([sample.frames, added])),
            distance_more,
            reached_more,
            held_more,
        )
    distance, distance_more = np.array(distance), np.array(distance_more)
    shown = (
        f"{np.nanmedian(reached):.3f} ({np.nanmin(reached):.3f}-{np.nanmax(reached):.3f})"
        if reached
        else "-"
    )
    print(
        f"{size:>6} {precision:>9.2f} {truly:>6.3f}  {np.mean(distance <= WITHIN):>11.0%} "
        f"{np.median(distance):>10.3f}  {np.mean(np.array(baseline) <= WITHIN):>12.0%}  "
        f"{np.mean(held) if held else np.nan:>11.0%}  {np.mean(distance_more <= WITHIN):>9.0%} "
        f"{np.mean(held_more) if held_more else np.nan:>11.0%}  {shown}"
    )


def answers_only(answers, precision: float) -> float:
    """The baseline: the lowest threshold between answered scores at which the answered frames
    kept, each weighing as the frames of its stratum, reach the precision (inf where none does);
    what the project's own count of kept frames per stratum adds is the difference."""
    from dataminer_dagster.assets.filter.calibration import _between, _ratio

    scores = np.unique(answers.score.astype(np.float32))
    for t in np.concatenate([[0.0], _between(scores[:-1], scores[1:])]):
        kept = answers.rule_allows & (answers.score.astype(np.float32) > np.float32(t))
        found, _ = _ratio(answers, answers.yes & kept, kept)
        if found >= precision:
            return float(t)
    return np.inf


if __name__ == "__main__":
    main()
