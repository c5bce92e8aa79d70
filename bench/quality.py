"""The pipeline's quality, end to end, on a world no model, test or script has seen.

A world of seed `--world-seed` (core.world; 9001 by default, a seed nothing else uses) is written,
served on 127.0.0.1 and mined by the real pipeline: `dataminer run` in a process of its own, in a
scratch DATAMINER_HOME with the embedded PostgreSQL, the project the demo's (demo.demo_config:
the red and white shapes asked for, the junk scenes as negative prompts, the shipped world SigLIP
and YOLO). Then the pipeline's outputs are read back and measured against the world's truth
(core.world_truth), a frame's truth found from its video's URL and its timestamp:

* filter, over every frame the pipeline extracted (the filter's per-video tables): precision is
  the share of kept frames that show the object asked for at all; recall the share of frames that
  show it clearly (at least half of it visible) that are kept; a frame of a junk scene (a blurred
  one shows objects) shows nothing asked for. Overall: the filter's own decision
  against "shows any prompted object". Per prompt: the filter's rule with that prompt as the only
  positive one (the project's negative prompts and thresholds), against "shows that object".
* dedup, over the frames the filter passed (the dedup table): two frames truly are duplicates when
  they show the same scene of the same source clip, whatever the video (the truth's `group`: a
  planted copy's frames and its source's, and one video's frames of one scene); the pipeline
  says so when it puts them in one dedup group. Pair precision and recall over all unordered
  pairs of frames, and over the pairs of frames of two different videos (the planted copies
  only); and, stricter, over the pairs of frames of two videos that show the same frame of the
  source clip (a join of one scene's other moments then counts as wrong). Near-duplicates across
  splits: pairs of dataset images of one truth group that lie in different splits. Beside the
  stage's groups, every pair of passed frames compared by the cosine of their cached embeddings:
  the lowest within a truth group, the highest across two, and the pair figures of the connected
  components of all pairs at each of a range of thresholds.
* detection: mAP50 (bench/quality_metrics.py) of the pipeline's detections (made at the
  project's confidence, 0.25) on the dataset's images against every truth box.
* the value of mining: fresh tiny YOLOs (scripts/train_world_yolo.py's graph and trainer) trained
  on the mined dataset's images (all splits), and on as many frames taken at even steps from all
  the frames the pipeline extracted of the same videos; labelled from the truth (what selection
  is worth), and the mined images also with the dataset's own boxes (what the pipeline is worth).
  Each set is trained with the same epochs and each training seed, and scored by mAP50 on every
  other frame of another unseen world (`--eval-world-seed`), with Ultralytics' own `val` beside.

    python bench/quality.py [--seeds 0 1 2] [--epochs 150] [--json FILE]
    python bench/quality.py --seeds 0 --epochs 50   # one seed, shorter
    python bench/quality.py --seeds                  # no training: filter, dedup, detection only
    python bench/quality.py --seeds --siglip DIR --yolo FILE   # other world models than the shipped
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from quality_metrics import (  # noqa: E402 - bench/quality_metrics.py
    PrecisionRecall,
    frame_precision_recall,
    map50,
    pair_precision_recall,
    pairs_across,
)

from dataminer_dagster.core.world import WrittenWorld, load_world, plan_world, write_world  # noqa: E402
from dataminer_dagster.core.world_truth import FrameTruth  # noqa: E402

WORLD_SEED = 9001  # the mined world: no test, script or model has used it
EVAL_WORLD_SEED = 9002  # the world the trained detectors are scored on
CLEAR = 0.5  # an object at least this visible is one the filter ought to find
PROJECT = "quality"
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Mined:
    """What one `dataminer run` of the world left: its project's folder, its config, the URL of
    each video id, and every frame it extracted with its truth."""

    project: Path
    data: Path  # its DATAMINER_DATA_DIR (videos, frames, the embedding cache)
    config: dict
    urls: dict[str, str]
    world: WrittenWorld
    run_s: float

    def truth(self, video_id: str, timestamp: float) -> FrameTruth:
        return self.world.truth_for(self.urls[video_id]).at(timestamp)

    def with_truth(self, table: pd.DataFrame) -> pd.DataFrame:
        return table.assign(
            truth=[
                self.truth(v, t) for v, t in zip(table["video_id"], table["timestamp"], strict=True)
            ]
        )


def dataminer(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The `dataminer` command of this checkout, with `home` its DATAMINER_HOME and the embedded
    PostgreSQL (no DATAMINER_DATABASE_URL, no DAGSTER_HOME)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "DATAMINER_DATABASE_URL")
    }
    env.update(
        DATAMINER_HOME=str(home),
        DATAMINER_DATA_DIR=str(home / "data"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    return subprocess.run(
        [str(Path(sys.executable).parent / "dataminer"), *args],
        env=env,
        cwd=home,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def mine(root: Path, seed: int, sources: int, siglip: Path | None, yolo: Path | None) -> Mined:
    import sqlalchemy as sa
    import yaml

    from dataminer_dagster.db.schema import videos
    from dataminer_dagster.demo import demo_config, serve_directory

    write_world(root / "www", plan_world(seed, sources=sources))
    world = load_world(root / "www")
    home = root / "home"
    home.mkdir()
    with serve_directory(root / "www") as base:
        config = demo_config(PROJECT, world.urls(base), home / "data" / "projects" / PROJECT)
        if siglip is not None:
            config["filter"]["model"] = str(siglip.resolve())
        if yolo is not None:
            config["detect"]["model"] = str(yolo.resolve())
        path = root / f"{PROJECT}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        started = time.perf_counter()
        run = dataminer(home, "run", str(path), "--no-progress", timeout=RUN_TIMEOUT_S)
        run_s = time.perf_counter() - started
    try:
        if run.returncode != 0:
            raise SystemExit(f"dataminer run failed ({run.returncode}):\n{run.stdout[-4000:]}")
        print(run.stdout.strip())
        url = dataminer(home, "db", "url").stdout.strip()
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            rows = conn.execute(sa.select(videos.c.video_id, videos.c.url)).all()
        engine.dispose()
    finally:
        dataminer(home, "db", "stop")
    return Mined(
        project=Path(config["output_dir"]),
        data=home / "data",
        config=config,
        urls={row.video_id: row.url for row in rows},
        world=world,
        run_s=run_s,
    )


def extracted_frames(mined: Mined) -> pd.DataFrame:
    """Every frame of every video with its filter scores and decision, and its truth."""
    from dataminer_dagster.paths import ProjectPaths

    tables = [
        pd.read_parquet(path).assign(video_id=path.stem)
        for path in sorted(ProjectPaths(mined.project).filter_dir.glob("*.parquet"))
    ]
    frames = pd.concat(tables, ignore_index=True).sort_values(["video_id", "frame_index"])
    return mined.with_truth(frames.reset_index(drop=True))


def filter_figures(mined: Mined, frames: pd.DataFrame) -> dict[str, PrecisionRecall]:
    from dataminer_dagster.assets.filter.config import FilterConfig
    from dataminer_dagster.assets.filter.filter_rule import apply_filter_rule
    from dataminer_dagster.assets.filter.table import prompt_columns

    config = FilterConfig(**mined.config["filter"])
    columns = prompt_columns(config)
    n_positive = len(config.positive_prompts)
    others = columns[n_positive:]  # negative, then junk
    # a junk scene (a blurred one shows objects) is never what a prompt asks for
    truths = frames["truth"].tolist()
    labels = [{o.label for o in t.objects if not t.is_junk} for t in truths]
    clear = [{o.label for o in t.objects if o.visible >= CLEAR and not t.is_junk} for t in truths]
    prompts = set(config.positive_prompts)
    figures = {
        "all prompts": frame_precision_recall(
            frames["passed"].to_numpy(),
            [bool(found & prompts) for found in labels],
            [bool(found & prompts) for found in clear],
        )
    }
    for prompt, column in zip(config.positive_prompts, columns, strict=False):
        alone = apply_filter_rule(
            frames[[column, *others]].to_numpy(),
            n_positive=1,
            n_negative=len(config.negative_prompts),
            n_junk=len(config.junk_prompts),
            thresholds=config,
        ).passed
        figures[prompt] = frame_precision_recall(
            alone, [prompt in found for found in labels], [prompt in found for found in clear]
        )
    return figures


def pairs_of_two_videos(predicted: list, true: list, video: list) -> PrecisionRecall:
    """`pair_precision_recall` over the pairs of items of two different videos only."""
    both = pairs_across([f"{p}|{t}" for p, t in zip(predicted, true, strict=True)], video)
    return PrecisionRecall(
        correct=both,
        predicted=pairs_across(predicted, video),
        found=both,
        relevant=pairs_across(true, video),
    )


SWEPT_THRESHOLDS = (0.95, 0.92, 0.9, 0.88, 0.86, 0.84, 0.82, 0.8, 0.78, 0.75, 0.7)


def passed_embeddings(mined: Mined, passed: pd.DataFrame) -> np.ndarray:
    """The filter's cached embeddings of the passed frames, one row per row of `passed`."""
    from dataminer_dagster.core.embedding_cache import EmbeddingCache
    from dataminer_dagster.models.loading import resolve_model
    from dataminer_dagster.paths import DataPaths

    slug = resolve_model(mined.config["filter"]["model"]).slug
    cache = EmbeddingCache(DataPaths(mined.data).embeddings_dir(), slug)
    vectors = np.zeros((len(passed), 0), np.float32)
    for video_id, rows in passed.groupby("video_id", sort=False):
        found, cached = cache.get(video_id, rows["content_hash"].tolist())
        if not found.all():
            raise SystemExit(f"the embedding cache lacks passed frames of {video_id}")
        if vectors.shape[1] == 0:
            vectors = np.zeros((len(passed), cached.shape[1]), np.float32)
        vectors[passed.index.get_indexer(rows.index)] = cached
    return vectors


def separation(similarity: np.ndarray, scene: list) -> dict:
    """How far apart a similarity of every two frames (the embeddings' cosine, the colours'
    overlap) puts one scene's frames and two scenes' frames: the lowest of two frames of one
    truth group and the highest of two frames of two groups. No threshold groups every scene
    whole and joins none when the second is the higher."""
    same = np.equal.outer(np.array(scene, dtype=object), np.array(scene, dtype=object))
    upper = np.triu(np.ones_like(same), 1)
    within, between = similarity[same & upper], similarity[~same & upper]
    return {
        "lowest within a scene": float(within.min()) if within.size else None,
        "highest across scenes": float(between.max()) if between.size else None,
    }


def grouped_at(
    vectors: np.ndarray,
    threshold: float,
    overlap: np.ndarray | None = None,
    least_overlap: float = 0.0,
) -> list[int]:
    """The connected components of every pair of passed frames at `threshold` (the pairs the
    stage's own search reports, `grouping.similar_pairs`): the grouping a full dedup would reach
    if it compared every frame with every other (the stage compares each video's kept frame, or
    new frames with the kept ones, so it sees a subset of these pairs). With `overlap` (the colour
    check), only the pairs whose colours overlap by at least `least_overlap`."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    from dataminer_dagster.assets.dedup.grouping import similar_pairs

    left, right = similar_pairs(vectors, threshold)
    if overlap is not None:
        alike = overlap[left, right] >= least_overlap
        left, right = left[alike], right[alike]
    edges = coo_matrix((np.ones(len(left)), (left, right)), shape=(len(vectors), len(vectors)))
    _, labels = connected_components(edges, directed=False)
    return labels.tolist()


# The stage's colour check (dedup.colour_overlap, assets/dedup/colour_check.py) on every pair of
# passed frames: two frames are copies when their cosine is at least the threshold and their colour
# histograms overlap by at least the share given, which a mirror, a crop or a moved object changes
# little and another scene's background a lot.
COLOUR_CHECKS = tuple((t, o) for t in (0.5, 0.6, 0.7, 0.8, 0.88) for o in (0.75, 0.8, 0.85, 0.9))


def colour_histograms(mined: Mined, passed: pd.DataFrame) -> np.ndarray:
    """Each passed frame's colour histogram, as the dedup stage computes it."""
    from dataminer_dagster.assets.dedup.colour_check import colour_histogram

    return np.stack(
        [
            colour_histogram(Path(file) if Path(file).is_absolute() else mined.data / file)
            for file in passed["file"]
        ]
    )


def colour_overlap(histograms: np.ndarray) -> np.ndarray:
    """The histogram intersection of every two frames (1: the same colours in the same shares)."""
    return np.stack([np.minimum(row, histograms).sum(axis=1) for row in histograms])


def dedup_figures(mined: Mined, dataset: pd.DataFrame) -> dict:
    from dataminer_dagster.paths import ProjectPaths

    passed = mined.with_truth(pd.read_parquet(ProjectPaths(mined.project).dedup_table))
    predicted = passed["group"].tolist()
    scene = [t.group for t in passed["truth"]]
    vectors = passed_embeddings(mined, passed)
    overlap = colour_overlap(colour_histograms(mined, passed))
    # one frame of the source clip (a sped-up copy's frame shows a later source time)
    moment = [f"{t.group}@{t.source_t:.3f}" for t in passed["truth"]]
    video = passed["video_id"].tolist()
    dataset_scenes = pd.Series([t.group for t in dataset["truth"]], index=dataset.index)
    return {
        "frames": len(passed),
        "all pairs": pair_precision_recall(predicted, scene),
        "pairs of two videos": pairs_of_two_videos(predicted, scene, video),
        "same frame, two videos": pairs_of_two_videos(predicted, moment, video),
        "near-duplicates across splits": pairs_across(
            dataset_scenes.tolist(), dataset["split"].tolist()
        ),
        "truth groups across splits": int(
            (dataset.groupby(dataset_scenes)["split"].nunique() > 1).sum()
        ),
        "separation": separation(vectors @ vectors.T, scene),
        "every pair, by threshold": {
            threshold: pair_precision_recall(grouped_at(vectors, threshold), scene)
            for threshold in SWEPT_THRESHOLDS
        },
        "colour overlap": separation(overlap, scene),
        "every pair with the colour check": {
            f"{threshold:.2f} / {least:.2f}": pair_precision_recall(
                grouped_at(vectors, threshold, overlap, least), scene
            )
            for threshold, least in COLOUR_CHECKS
        },
    }


def truth_boxes(truth: FrameTruth) -> list[tuple[str, tuple[int, int, int, int]]]:
    return [(o.shape, tuple(o.box)) for o in truth.objects]


def detection_figures(mined: Mined, dataset: pd.DataFrame) -> dict:
    from dataminer_dagster.paths import ProjectPaths

    found = pd.read_parquet(ProjectPaths(mined.project).detections_table)
    by_file = {
        name: [(r.label, float(r.score), (r.x, r.y, r.w, r.h)) for r in rows.itertuples()]
        for name, rows in found.groupby("file_name")
    }
    names = dataset["file_name"].tolist()
    mean, per_class = map50(
        [by_file.get(name, []) for name in names], [truth_boxes(t) for t in dataset["truth"]]
    )
    return {
        "images": len(names),
        "boxes": sum(len(by_file.get(name, [])) for name in names),
        "map50": mean,
        "per_class": per_class,
    }


@dataclass(frozen=True)
class Labelled:
    image: Path
    width: int
    height: int
    boxes: list[tuple[str, tuple[float, float, float, float]]]


def training_sets(mined: Mined, frames: pd.DataFrame, dataset: pd.DataFrame) -> dict:
    """The mined images labelled from the truth and by the pipeline, and as many frames at even
    steps through all the extracted frames, labelled from the truth."""
    from dataminer_dagster.paths import ProjectPaths

    folder = ProjectPaths(mined.project).dataset_dir
    coco = json.loads((folder / "annotations.coco.json").read_text())
    names = {c["id"]: c["name"] for c in coco["categories"]}
    file_of = {image["id"]: image["file_name"] for image in coco["images"]}
    boxes: dict[str, list] = {name: [] for name in file_of.values()}
    for a in coco["annotations"]:
        boxes[file_of[a["image_id"]]].append((names[a["category_id"]], tuple(a["bbox"])))
    count = len(dataset)
    uniform = frames.iloc[((np.arange(count) + 0.5) * len(frames) / count).astype(int)]
    mined_rows = list(dataset.itertuples())
    return {
        "mined, truth labels": [
            Labelled(folder / "images" / r.file_name, r.width, r.height, truth_boxes(r.truth))
            for r in mined_rows
        ],
        "uniform, truth labels": [
            Labelled(Path(r.file), r.width, r.height, truth_boxes(r.truth))
            for r in uniform.itertuples()
        ],
        "mined, pipeline labels": [
            Labelled(folder / "images" / r.file_name, r.width, r.height, boxes[r.file_name])
            for r in mined_rows
        ],
    }


def evaluation_frames(root: Path, seed: int) -> list[Labelled]:
    """Every other frame of world `seed` as scripts/train_world_yolo.py writes a validation split
    (images/val, labels/val under `root`), read back with its boxes."""
    from PIL import Image
    from train_world_yolo import EVAL_FRAME_STEP, write_split

    from dataminer_dagster.core.world_render import SHAPES

    write_split(root, "val", [seed], EVAL_FRAME_STEP)
    frames = []
    for image in sorted((root / "images" / "val").iterdir()):
        width, height = Image.open(image).size
        boxes = []
        for line in (root / "labels" / "val" / f"{image.stem}.txt").read_text().splitlines():
            cls, cx, cy, w, h = line.split()
            w, h = float(w) * width, float(h) * height
            x, y = float(cx) * width - w / 2, float(cy) * height - h / 2
            boxes.append((SHAPES[int(cls)], (x, y, w, h)))
        frames.append(Labelled(image, width, height, boxes))
    return frames


def write_training_set(root: Path, images: list[Labelled], evaluation: Path) -> Path:
    """`images` as the train split of a YOLO dataset under `root`, `evaluation`'s val split as its
    val split; its data.yaml."""
    from train_world_yolo import write_data_yaml, yolo_label_text

    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    for number, item in enumerate(images):
        stem = f"{number:04d}_{item.image.stem}"
        shutil.copyfile(item.image, root / "images" / "train" / f"{stem}{item.image.suffix}")
        (root / "labels" / "train" / f"{stem}.txt").write_text(
            yolo_label_text(item.boxes, item.width, item.height)
        )
    for kind in ("images", "labels"):
        (root / kind / "val").symlink_to(evaluation / kind / "val", target_is_directory=True)
    return write_data_yaml(root)


def score_detector(weights: Path, frames: list[Labelled], data: Path, imgsz: int) -> dict:
    """mAP50 of `weights` on `frames` (bench/quality_metrics.py, on predictions at Ultralytics'
    validation settings), and Ultralytics' own `val` of the same split."""
    from ultralytics import YOLO

    model = YOLO(str(weights))
    predictions = []
    for start in range(0, len(frames), 32):
        chunk = [str(f.image) for f in frames[start : start + 32]]
        for result in model.predict(
            chunk, imgsz=imgsz, conf=0.001, iou=0.7, device="cpu", verbose=False
        ):
            found = []
            for (x0, y0, x1, y1), cls, conf in zip(
                result.boxes.xyxy.tolist(),
                result.boxes.cls.tolist(),
                result.boxes.conf.tolist(),
                strict=True,
            ):
                found.append((result.names[int(cls)], float(conf), (x0, y0, x1 - x0, y1 - y0)))
            predictions.append(found)
    mean, _ = map50(predictions, [f.boxes for f in frames])
    theirs = model.val(
        data=str(data), imgsz=imgsz, batch=32, device="cpu", plots=False, verbose=False
    )
    return {"map50": mean, "ultralytics_map50": float(theirs.box.map50)}


def value_of_mining(
    root: Path, sets: dict, *, eval_seed: int, seeds: Sequence[int], epochs: int, args
) -> dict:
    """Each training set trained with each seed and scored on the evaluation world."""
    from train_world_yolo import train_detector

    evaluation = root / "evaluation"
    frames = evaluation_frames(evaluation, eval_seed)
    results: dict[str, list] = {name: [] for name in sets}
    for seed in seeds:
        for name, images in sets.items():
            work = root / "training" / f"{name.replace(', ', '-').replace(' ', '_')}-{seed}"
            data = write_training_set(work / "dataset", images, evaluation)
            started = time.perf_counter()
            weights = train_detector(
                data,
                work,
                epochs=epochs,
                imgsz=args.imgsz,
                batch=args.batch_size,
                workers=args.workers,
                seed=seed,
                # a step per batch: accumulating batches to Ultralytics' nominal 64 images
                # would leave a few dozen steps on a few dozen images
                nbs=args.batch_size,
            )
            train_s = time.perf_counter() - started
            figures = score_detector(weights, frames, data, args.imgsz)
            results[name].append(dict(figures, seed=seed, train_s=round(train_s)))
            print(
                f"  {name}, seed {seed}: mAP50 {figures['map50']:.3f} "
                f"(Ultralytics {figures['ultralytics_map50']:.3f}), trained in {train_s:.0f} s",
                flush=True,
            )
    return {
        "images": len(next(iter(sets.values()))),
        "eval_world_seed": eval_seed,
        "eval_frames": len(frames),
        "epochs": epochs,
        "seeds": list(seeds),
        "runs": results,
    }


def as_json(value):
    if isinstance(value, PrecisionRecall):
        return {
            "precision": round(value.precision, 4),
            "recall": round(value.recall, 4),
            "correct": value.correct,
            "predicted": value.predicted,
            "found": value.found,
            "relevant": value.relevant,
        }
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, float):
        return round(value, 4)
    return value


def print_report(report: dict) -> None:
    def share(value: float, part: int, whole: int) -> str:
        return f"{value:.3f} ({part}/{whole})" if whole else "-"

    def separation_line(what: str, figures: dict) -> None:
        shown = ", ".join(
            f"{name} {'-' if value is None else f'{value:.3f}'}" for name, value in figures.items()
        )
        print(f"  {what}: {shown}")

    def pr(name: str, figures: PrecisionRecall) -> None:
        print(
            f"  {name:28s} precision "
            f"{share(figures.precision, figures.correct, figures.predicted):15s}"
            f" recall {share(figures.recall, figures.found, figures.relevant)}"
        )

    print(
        f"world {report['world_seed']}: {report['frames']} frames extracted, "
        f"{report['kept']} kept by the filter, {report['images']} dataset images "
        f"({report['splits']}); `dataminer run` {report['run_s']:.0f} s"
    )
    print(f"models: {report['siglip']}, {report['yolo']}")
    print("filter (frames)")
    for name, figures in report["filter"].items():
        pr(name, figures)
    print(f"  junk frames kept: {report['junk_kept']}")
    dedup = report["dedup"]
    print(f"dedup ({dedup['frames']} passed frames)")
    pr("all pairs", dedup["all pairs"])
    pr("pairs of two videos", dedup["pairs of two videos"])
    pr("same frame, two videos", dedup["same frame, two videos"])
    print(
        f"  near-duplicate pairs across splits: {dedup['near-duplicates across splits']} "
        f"({dedup['truth groups across splits']} truth groups in two splits or more)"
    )
    separation_line("cosine of the passed frames' embeddings", dedup["separation"])
    print("  every pair compared, at threshold:")
    for threshold, figures in dedup["every pair, by threshold"].items():
        pr(f"  {threshold:.2f}", figures)
    separation_line("colour overlap of the passed frames", dedup["colour overlap"])
    print("  every pair compared, at threshold / least colour overlap:")
    for rule, figures in dedup["every pair with the colour check"].items():
        pr(f"  {rule}", figures)
    detection = report["detection"]
    print(
        f"detection: mAP50 {detection['map50']:.3f} on {detection['images']} images, "
        f"{detection['boxes']} boxes; per class "
        + ", ".join(f"{k} {v:.3f}" for k, v in detection["per_class"].items())
    )
    value = report.get("value of mining")
    if value:
        print(
            f"value of mining: {value['images']} training images each, {value['epochs']} "
            f"epochs, seeds {value['seeds']}, scored on {value['eval_frames']} frames of "
            f"world {value['eval_world_seed']}"
        )
        for name, runs in value["runs"].items():
            ours = [r["map50"] for r in runs]
            theirs = [r["ultralytics_map50"] for r in runs]
            print(
                f"  {name:28s} mAP50 mean {np.mean(ours):.3f} ({', '.join(f'{v:.3f}' for v in ours)})"
                f"; Ultralytics val {np.mean(theirs):.3f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-seed", type=int, default=WORLD_SEED)
    parser.add_argument(
        "--sources", type=int, default=6, help="source clips of the world (each has a copy)"
    )
    parser.add_argument("--eval-world-seed", type=int, default=EVAL_WORLD_SEED)
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        help="training seeds of the value of mining (none: no training)",
    )
    parser.add_argument("--epochs", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=192)
    parser.add_argument("--workers", type=int, default=1, help="data loader processes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--siglip", type=Path, help="a SigLIP model directory (default: shipped)")
    parser.add_argument("--yolo", type=Path, help="a YOLO checkpoint (default: the shipped one)")
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: removed)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    os.environ.setdefault("YOLO_VERBOSE", "False")  # before Ultralytics is imported
    import torch

    torch.set_num_threads(args.threads)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()
    root = args.workdir or Path(tempfile.mkdtemp(prefix="dm-quality-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        mined = mine(root, args.world_seed, args.sources, args.siglip, args.yolo)
        frames = extracted_frames(mined)
        from dataminer_dagster.paths import ProjectPaths

        dataset = mined.with_truth(
            pd.read_parquet(ProjectPaths(mined.project).dataset_dir / "manifest.parquet")
        )
        report = {
            "date": started,
            "load_at_start": [round(v, 1) for v in load],
            "world_seed": args.world_seed,
            "sources": args.sources,
            "siglip": mined.config["filter"]["model"],
            "yolo": mined.config["detect"]["model"],
            "run_s": mined.run_s,
            "frames": len(frames),
            "kept": int(frames["passed"].sum()),
            "junk_kept": int(sum(t.is_junk for t in frames.loc[frames["passed"], "truth"])),
            "images": len(dataset),
            "splits": ", ".join(f"{k} {v}" for k, v in dataset["split"].value_counts().items()),
            "filter": filter_figures(mined, frames),
            "dedup": dedup_figures(mined, dataset),
            "detection": detection_figures(mined, dataset),
        }
        if args.seeds:
            report["value of mining"] = value_of_mining(
                root,
                training_sets(mined, frames, dataset),
                eval_seed=args.eval_world_seed,
                seeds=args.seeds,
                epochs=args.epochs,
                args=args,
            )
        report["load_at_end"] = [round(v, 1) for v in os.getloadavg()]
        print_report(report)
        if args.json:
            args.json.write_text(json.dumps(as_json(report), indent=1))
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
