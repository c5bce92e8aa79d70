"""What the demo's settings (dataminer_dagster/demo.py) keep and group on worlds of other seeds,
with the shipped world SigLIP, against each world's truth; the figures its choices rest on.

For each world: frames every `extract.every_seconds` of every clip (decoded with OpenCV, saved as
JPEG at the extraction's default quality), scored by the filter stage's SiglipScorer, decided by
the filter's own rule with the demo's prompts and thresholds, and the frames that pass grouped by
the dedup stage's `deduplicate` at the demo's threshold and colour overlap. Then, against the
truth:

* filter: precision (kept frames that show a prompted object at all), recall (frames that show one
  clearly, visible >= 0.5, that are kept), junk frames kept;
* dedup: images left, groups that join frames of two source clips (wrong), source clips whose
  planted copy shares no group with them (missed), the highest similarity of two frames of
  different source clips, the lowest best similarity of a copy's frames with its source's;
* the same rule with one prompt per object ("a red circle" alone), pooled over the worlds: why
  the demo asks for every shape of a colour instead.

    python bench/demo_world.py [--seeds 1-8]
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from dataminer_dagster.assets.dedup.colour_check import ColourCheck, colour_histogram
from dataminer_dagster.assets.dedup.grouping import deduplicate
from dataminer_dagster.assets.filter.config import FilterConfig
from dataminer_dagster.assets.filter.filter_rule import apply_filter_rule
from dataminer_dagster.core.world import load_world, plan_world, write_world
from dataminer_dagster.core.world_render import COLOURS, SHAPES
from dataminer_dagster.core.world_truth import FrameTruth
from dataminer_dagster.demo import PROMPTED_COLOURS, demo_config

JPEG_QUALITY = 95  # extract.quality's default


def sample(directory: Path, every_s: float) -> list[tuple[str, str, Path, FrameTruth]]:
    """(video file, source clip, JPEG, truth) of a frame every `every_s` of each world video."""
    import cv2

    world = load_world(directory)
    frames = []
    for path, truth in world.truths.items():
        if "/" in path:  # a second URL of a file: the pipeline keeps one of the two
            continue
        capture = cv2.VideoCapture(str(directory / path))
        index = taken = 0
        while True:
            ok, image = capture.read()
            if not ok:
                break
            if index / truth.fps + 1e-6 >= taken * every_s:
                jpeg = directory / "frames" / f"{path}_{index:04d}.jpg"
                jpeg.parent.mkdir(exist_ok=True)
                cv2.imwrite(str(jpeg), image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
                frames.append((path, truth.source, jpeg, truth.at(index / truth.fps)))
                taken += 1
            index += 1
        capture.release()
    return frames


def measure(seed: int, scorer, config: dict, root: Path, singles: dict) -> dict:
    directory = root / f"world{seed}"
    write_world(directory, plan_world(seed))
    frames = sample(directory, config["extract"]["every_seconds"])
    rule = FilterConfig(**config["filter"])
    positives, negatives = rule.positive_prompts, rule.negative_prompts
    objects = [f"a {c} {s}" for c in COLOURS for s in SHAPES]
    embeddings = scorer.embed_all([jpeg for _, _, jpeg, _ in frames]).embeddings
    scores = scorer.score(embeddings, scorer.embed_texts(positives + negatives + objects))
    decision = apply_filter_rule(
        scores[:, : len(positives) + len(negatives)],
        n_positive=len(positives),
        n_negative=len(negatives),
        n_junk=0,
        thresholds=rule,
    )
    truths = [truth for *_, truth in frames]
    shows = np.array([any(o.colour in PROMPTED_COLOURS for o in t.objects) for t in truths])
    clearly = np.array(
        [any(o.colour in PROMPTED_COLOURS and o.visible >= 0.5 for o in t.objects) for t in truths]
    )
    junk = np.array([t.junk is not None for t in truths])
    kept = decision.passed
    for column, prompt in enumerate(objects, start=len(positives) + len(negatives)):
        alone = apply_filter_rule(
            scores[:, [column, *range(len(positives), len(positives) + len(negatives))]],
            n_positive=1,
            n_negative=len(negatives),
            n_junk=0,
            thresholds=rule,
        ).passed
        has = np.array([prompt in {o.label for o in t.objects} for t in truths])
        has_clearly = np.array(
            [any(o.label == prompt and o.visible >= 0.5 for o in t.objects) for t in truths]
        )
        singles[prompt] += np.array(
            [(alone & has).sum(), alone.sum(), (alone & has_clearly).sum(), has_clearly.sum()]
        )

    passed = np.flatnonzero(kept)
    videos = [frames[i][0] for i in passed]
    sources = np.array([frames[i][1] for i in passed])
    least = config["dedup"].get("colour_overlap")
    colours = None
    if least is not None:
        colours = ColourCheck(np.stack([colour_histogram(frames[i][2]) for i in passed]), least)
    grouped = deduplicate(
        embeddings[passed],
        frame_ids=[f"{frames[i][0]}_{i:05d}" for i in passed],
        video_ids=videos,
        scores=decision.pos_max[passed],
        sharpness=np.zeros(len(passed)),
        threshold=config["dedup"]["threshold"],
        device="cpu",
        colours=colours,
    )
    x = embeddings[passed] / np.linalg.norm(embeddings[passed], axis=1, keepdims=True)
    similar = x @ x.T
    other_source = sources[:, None] != sources[None, :]
    members = defaultdict(set)
    for group, video in zip(grouped.group, videos, strict=True):
        members[group].add(video)
    by_source = defaultdict(set)
    for source, video in zip(sources, videos, strict=True):
        by_source[source].add(video)
    copy_best = []
    missed = 0
    for clips in by_source.values():
        if len(clips) < 2:
            continue
        missed += not any(len(m) > 1 and m <= clips for m in members.values())
        first = np.array([v == sorted(clips)[0] for v in videos])
        second = np.array([v in clips and v != sorted(clips)[0] for v in videos])
        copy_best.append(similar[np.ix_(first, second)].max())
    wrong = sum(
        len({sources[k] for k in np.flatnonzero(grouped.group == g)}) > 1
        for g in range(grouped.group.max() + 1)
    )
    return {
        "seed": seed,
        "frames": len(frames),
        "kept": int(kept.sum()),
        "precision": (kept & shows).sum() / max(kept.sum(), 1),
        "recall": (kept & clearly).sum() / max(clearly.sum(), 1),
        "junk kept": int((kept & junk).sum()),
        "images": grouped.kept,
        "wrong groups": wrong,
        "copies missed": missed,
        "max other clip": float(similar[other_source].max()) if other_source.any() else 0.0,
        "min copy best": float(min(copy_best)) if copy_best else 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1-8", help="first-last")
    args = parser.parse_args()
    first, last = (int(s) for s in args.seeds.split("-"))

    from dataminer_dagster.models.siglip import SiglipScorer

    config = demo_config("demo", [], Path("unused"))
    scorer = SiglipScorer(config["filter"]["model"], device="cpu")
    singles: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(4, dtype=np.int64))
    rows = []
    with tempfile.TemporaryDirectory(prefix="dm-demo-world-") as root:
        for seed in range(first, last + 1):
            rows.append(measure(seed, scorer, config, Path(root), singles))
            print(
                " ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in rows[-1].items()
                ),
                flush=True,
            )
    kept = sum(r["kept"] for r in rows)
    print(
        f"all: {kept} kept of {sum(r['frames'] for r in rows)} frames, precision "
        f"{sum(r['precision'] * r['kept'] for r in rows) / max(kept, 1):.3f}, junk kept "
        f"{sum(r['junk kept'] for r in rows)}, wrong groups {sum(r['wrong groups'] for r in rows)}"
        f", copies missed {sum(r['copies missed'] for r in rows)}"
    )
    print("one prompt per object, pooled: prompt precision recall")
    for prompt, (hits, alone, clear_hits, clear) in singles.items():
        print(f"  {prompt:18s} {hits / max(alone, 1):.2f} {clear_hits / max(clear, 1):.2f}")


if __name__ == "__main__":
    main()
