"""The dataset's checks, read from its files once it is in place.

Hard rules (severity ERROR, blocking: a failure fails the run, and the partition shows failed):
    dataset_complete       images on disk = manifest rows = COCO images, every named file present
    splits_complete        per split: manifest rows = each format's images = YOLO label files =
                           imagefolder metadata rows
    no_pairs_across_splits no video in two splits, no near-duplicate group across splits
    provenance_complete    every image has a source URL or path
Soft ones (WARN, with their numbers):
    splits_filled          every split with a share has images
    image_quality          no image blurry, dark or overexposed by the dataset section's thresholds
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE
from dataminer_dagster.assets.dataset.dataset_formats import format_file_counts
from dataminer_dagster.assets.dataset.dataset_splits import SPLITS, pairs_across_splits
from dataminer_dagster.engine.partition_checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.stage import StageContext
from dataminer_dagster.paths import ProjectPaths

EXAMPLES = 5  # named in a failed check's description


def check_dataset(root: Path, *, with_coco: bool) -> CheckResult:
    """The dataset in `root` holds as many images as its manifest has rows (and its COCO file
    images, `with_coco`), and every file they name is in images/."""
    import pandas as pd

    images_dir = root / IMAGES_DIR
    on_disk = {p.name for p in images_dir.iterdir()} if images_dir.is_dir() else set()
    manifest_path = root / MANIFEST_FILE
    named = (
        pd.read_parquet(manifest_path, columns=["file_name"])["file_name"].tolist()
        if manifest_path.is_file()
        else []
    )
    metrics = {"images": len(on_disk), "manifest_rows": len(named)}
    problems = [] if manifest_path.is_file() else [f"`{manifest_path}` is missing"]
    if with_coco:
        coco_path = root / COCO_FILE
        coco_names = (
            [image["file_name"] for image in json.loads(coco_path.read_text())["images"]]
            if coco_path.is_file()
            else []
        )
        metrics["coco_images"] = len(coco_names)
        if not coco_path.is_file():
            problems.append(f"`{coco_path}` is missing")
        named += coco_names
    missing = sorted(set(named) - on_disk)
    metrics["missing_files"] = len(missing)
    counts = {v for k, v in metrics.items() if k != "missing_files"}
    if len(counts) > 1:
        problems.append(
            "the counts differ: "
            + ", ".join(f"{k} {v}" for k, v in metrics.items() if k != "missing_files")
        )
    if missing:
        problems.append(
            f"{len(missing)} files named by the manifest or the COCO file are not in "
            f"`{images_dir}`, e.g. " + ", ".join(f"`{m}`" for m in missing[:EXAMPLES])
        )
    if not problems:
        return CheckResult(True, metrics)
    return CheckResult(
        False, metrics, f"The dataset in `{root}` is incomplete: " + "; ".join(problems) + "."
    )


def check_splits(root: Path, formats: list[str], *, with_boxes: bool) -> CheckResult:
    """Per split, the manifest's rows and what each format folder holds agree: COCO images,
    YOLO images and label files, imagefolder images and metadata rows."""
    import pandas as pd

    manifest = pd.read_parquet(root / MANIFEST_FILE, columns=["split"])
    rows = {s: int((manifest["split"] == s).sum()) for s in SPLITS}
    found = format_file_counts(root)
    metrics = {f"{s}_manifest_rows": rows[s] for s in SPLITS}
    problems = []
    expected = [f for f in formats if with_boxes or f == "hf"]
    for name in expected:
        if name not in found:
            problems.append(f"the {name} folder is missing")
            continue
        for split in SPLITS:
            for what, count in found[name][split].items():
                metrics[f"{split}_{name}_{what}"] = count
                if count != rows[split]:
                    problems.append(
                        f"{split}: {rows[split]} manifest rows but {count} {name} {what}"
                    )
    if not problems:
        return CheckResult(True, metrics)
    return CheckResult(
        False,
        metrics,
        f"The splits of the dataset in `{root}` disagree: " + "; ".join(problems[:EXAMPLES]) + ".",
    )


def check_no_pairs_across_splits(root: Path, dedup_table: Path) -> CheckResult:
    """No video has images in two splits, and no near-duplicate group (the dedup table's) has
    frames in videos of two splits."""
    import pandas as pd

    manifest = pd.read_parquet(root / MANIFEST_FILE, columns=["video_id", "split"])
    splits_per_video = manifest.groupby("video_id")["split"].nunique()
    spanning = sorted(splits_per_video[splits_per_video > 1].index)
    split_of = dict(zip(manifest["video_id"], manifest["split"], strict=True))
    table = pd.read_parquet(dedup_table, columns=["video_id", "group"])
    pairs = pairs_across_splits(zip(table["video_id"], table["group"], strict=True), split_of)
    metrics = {"videos_in_two_splits": len(spanning), "pairs_across_splits": pairs}
    if not spanning and not pairs:
        return CheckResult(True, metrics)
    said = []
    if spanning:
        said.append(
            f"{len(spanning)} videos have images in two splits, e.g. "
            + ", ".join(f"`{v}`" for v in spanning[:EXAMPLES])
        )
    if pairs:
        said.append(f"{pairs} pairs of near-duplicate frames lie in videos of different splits")
    return CheckResult(
        False,
        metrics,
        "The splits leak: " + "; ".join(said) + ". The dataset stage assigns whole source units "
        "to splits; `dataminer run` makes the dataset again.",
    )


def check_provenance(root: Path) -> CheckResult:
    """Every image of the manifest has a source URL or path."""
    import pandas as pd

    manifest = pd.read_parquet(root / MANIFEST_FILE, columns=["file_name", "source_url"])
    missing = manifest[manifest["source_url"].fillna("").astype(str).str.strip() == ""]
    metrics = {"images": len(manifest), "without_source": len(missing)}
    if missing.empty:
        return CheckResult(True, metrics)
    return CheckResult(
        False,
        metrics,
        f"{len(missing)} of {len(manifest)} images have no source URL or path, e.g. "
        + ", ".join(f"`{n}`" for n in missing["file_name"][:EXAMPLES])
        + ". A dataset whose images cannot be traced to their source cannot be audited.",
    )


def check_splits_filled(root: Path, ratios: dict[str, float]) -> CheckResult:
    """Every split with a share above 0 has images."""
    import pandas as pd

    manifest = pd.read_parquet(root / MANIFEST_FILE, columns=["split"])
    images = {s: int((manifest["split"] == s).sum()) for s in SPLITS}
    empty = [s for s in SPLITS if ratios[s] > 0 and not images[s]]
    metrics = {f"{s}_images": images[s] for s in SPLITS}
    if not empty:
        return CheckResult(True, metrics)
    return CheckResult(
        False,
        metrics,
        f"The {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty although "
        "given a share: the project has too few videos (with their near-duplicates and copies) "
        "for its splits. The quality report says more.",
    )


def check_image_quality(root: Path, config) -> CheckResult:
    """No image is blurry, dark or overexposed by the dataset section's thresholds."""
    import pandas as pd

    manifest = pd.read_parquet(root / MANIFEST_FILE, columns=["sharpness", "brightness"])
    metrics = {
        "images": len(manifest),
        "blurry": int((manifest["sharpness"] < config.blurry_below).sum()),
        "dark": int((manifest["brightness"] < config.dark_below).sum()),
        "overexposed": int((manifest["brightness"] > config.overexposed_above).sum()),
    }
    flagged = {k: v for k, v in metrics.items() if k != "images" and v}
    if not flagged:
        return CheckResult(True, metrics)
    return CheckResult(
        False,
        metrics,
        f"Of {len(manifest)} images: "
        + ", ".join(f"{v} {k}" for k, v in flagged.items())
        + f" (sharpness below {config.blurry_below:g}, brightness below {config.dark_below:g} "
        f"or above {config.overexposed_above:g}: dataset.blurry_below, dark_below, "
        "overexposed_above).",
    )


def _root(ctx: StageContext, project_name: str):
    project = ctx.catalog.projects.get(project_name)
    return project, ProjectPaths(project.output_dir)


def _complete(ctx: StageContext, name: str) -> CheckResult:
    project, paths = _root(ctx, name)
    return check_dataset(paths.dataset_dir, with_coco=project.config.detect is not None)


def _splits(ctx: StageContext, name: str) -> CheckResult:
    project, paths = _root(ctx, name)
    return check_splits(
        paths.dataset_dir,
        list(project.config.dataset.formats),
        with_boxes=project.config.detect is not None,
    )


def _leaks(ctx: StageContext, name: str) -> CheckResult:
    _, paths = _root(ctx, name)
    return check_no_pairs_across_splits(paths.dataset_dir, paths.dedup_table)


def _provenance(ctx: StageContext, name: str) -> CheckResult:
    _, paths = _root(ctx, name)
    return check_provenance(paths.dataset_dir)


def _filled(ctx: StageContext, name: str) -> CheckResult:
    project, paths = _root(ctx, name)
    return check_splits_filled(paths.dataset_dir, project.config.dataset.splits.model_dump())


def _quality(ctx: StageContext, name: str) -> CheckResult:
    project, paths = _root(ctx, name)
    return check_image_quality(paths.dataset_dir, project.config.dataset)


ERROR, WARN = dg.AssetCheckSeverity.ERROR, dg.AssetCheckSeverity.WARN

DATASET_CHECKS = [
    PartitionCheck(
        "dataset_complete",
        "Images on disk = manifest rows = COCO images, and every file they name is present.",
        _complete,
        ERROR,
        blocking=True,
    ),
    PartitionCheck(
        "splits_complete",
        "Per split: manifest rows = images of each format = YOLO label files = imagefolder "
        "metadata rows.",
        _splits,
        ERROR,
        blocking=True,
    ),
    PartitionCheck(
        "no_pairs_across_splits",
        "No video and no near-duplicate group spans two splits.",
        _leaks,
        ERROR,
        blocking=True,
    ),
    PartitionCheck(
        "provenance_complete",
        "Every image has a source URL or path.",
        _provenance,
        ERROR,
        blocking=True,
    ),
    PartitionCheck("splits_filled", "Every split given a share has images.", _filled, WARN),
    PartitionCheck(
        "image_quality",
        "No image is blurry, dark or overexposed by the dataset section's thresholds.",
        _quality,
        WARN,
    ),
]
