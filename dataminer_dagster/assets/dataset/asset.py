"""dataset: what a user takes away from a project, in `<output>/dataset/`.

    images/                  the kept frames (hard links; copies only across devices)
    annotations.coco.json    the detections (when the project detects), file names relative to images/
    manifest.parquet         one row per kept frame: video, source URL, every source of the
                             video (its copies': the same content found elsewhere), timestamp,
                             size and rotation (how far the frame was turned upright), filter
                             scores, dedup group and size, number of detections

Rebuilt atomically on every run: a re-run replaces the dataset, never appends to it. Its check,
`dataset_complete`, counts the images three ways (files, manifest rows, COCO images) and looks for
every file the manifest and the COCO file name; its preview is a sample of the images with their
annotations drawn.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.core.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE, place_images
from dataminer_dagster.core.files import publish
from dataminer_dagster.core.images import read_image
from dataminer_dagster.core.redact import redact_url
from dataminer_dagster.core.visualize import contact_sheet, draw_detections
from dataminer_dagster.db.project_flow import project_members
from dataminer_dagster.db.retention import release_finished_frames
from dataminer_dagster.engine.checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.previews import preview_metadata
from dataminer_dagster.engine.registry import DATASET
from dataminer_dagster.engine.stage import StageContext, StageItem, stage_asset
from dataminer_dagster.paths import ProjectPaths


def _sources(catalog, project_id: int, videos: dict) -> dict[str, list[str]]:
    """Every URL or path the project found each video at: its own and its copies', in the order
    the project linked them (a dataset travels: no passwords or signed tokens in them)."""
    found = catalog.project_sources(project_id, videos)
    return {
        video_id: [
            redact_url(url) if url else path
            for url, path in found.get(video_id) or [(video.url, video.source_path)]
        ]
        for video_id, video in videos.items()
    }


def _publish(catalog, conn, project, staging: Path, final: Path) -> list[Path]:
    """Publish the dataset and release the members' frames; returns the frames set aside."""
    publish(staging, final)
    members = [row.video_id for row in project_members(catalog.engine, project.id)]
    return release_finished_frames(catalog, conn, members, completing=project.name).aside


MANIFEST_COLUMNS = [
    "file_name",
    "video_id",
    "source_url",
    "sources",
    "video_title",
    "frame_index",
    "timestamp",
    "width",
    "height",
    "rotation",
    "pos_max",
    "best_prompt",
    "sharpness",
    "group",
    "group_size",
    "detections",
]


SAMPLE_SIZE = 8  # images in the dataset's preview


def _dataset_complete(ctx: StageContext, project_name: str) -> CheckResult:
    project = ctx.catalog.project(project_name)
    root = ProjectPaths(project.output_dir).dataset_dir
    return check_dataset(root, with_coco=project.config.detect is not None)


def check_dataset(root: Path, *, with_coco: bool) -> CheckResult:
    """The dataset in `root` holds as many images as its manifest has rows (and its COCO file
    images, `with_coco`), and every file they name is in images/."""
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
            f"`{images_dir}`, e.g. " + ", ".join(f"`{m}`" for m in missing[:5])
        )
    if not problems:
        return CheckResult(True, metrics)
    return CheckResult(
        False, metrics, f"The dataset in `{root}` is incomplete: " + "; ".join(problems) + "."
    )


def _sample_preview(staging: Path, manifest: pd.DataFrame, with_coco: bool, previews: Path) -> dict:
    """A sample of the dataset's images with their COCO annotations drawn (the images with the
    most annotations first)."""
    boxes: dict[str, list[Detection]] = {name: [] for name in manifest["file_name"]}
    if with_coco:
        coco = json.loads((staging / COCO_FILE).read_text())
        names = {image["id"]: image["file_name"] for image in coco["images"]}
        labels = {c["id"]: c["name"] for c in coco["categories"]}
        for a in coco["annotations"]:
            boxes[names[a["image_id"]]].append(
                Detection(*a["bbox"], a.get("score", 1.0), labels[a["category_id"]])
            )
    sample = sorted(boxes, key=lambda name: (-len(boxes[name]), name))[:SAMPLE_SIZE]
    pictures = [
        draw_detections(read_image(staging / IMAGES_DIR / name), boxes[name]) for name in sample
    ]
    what = "annotations" if with_coco else "images (no detect section: no annotations)"
    captions = [
        f"{len(boxes[name])} box{'' if len(boxes[name]) == 1 else 'es'}: {name}"
        if with_coco
        else name
        for name in sample
    ]
    sheet = contact_sheet(
        pictures, captions, columns=4, tile_width=200, tile_height=150, empty=f"no {what}"
    )
    return preview_metadata(
        "dataset_sample", sheet, previews, cover=pictures[0] if pictures else None
    )


@stage_asset(
    stage=DATASET,
    kinds={"image", "parquet", "json"},
    loadable=True,  # a downstream asset loads it (outputs.py)
    checks=[
        PartitionCheck(
            "dataset_complete",
            "Images on disk = manifest rows = COCO images, and every file they name is present.",
            _dataset_complete,
        )
    ],
)
def dataset(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's dataset: kept images, COCO annotations and a Parquet manifest."""
    catalog = ctx.catalog
    project = catalog.project(item.key)
    paths = ProjectPaths(project.output_dir)
    kept = pd.read_parquet(paths.dedup_table)
    kept = kept[kept["kept"]].reset_index(drop=True)
    if "rotation" not in kept:  # a dedup table from before frames were turned: none was
        kept["rotation"] = 0
    kept["file_name"] = [Path(f).name for f in kept["file"]]

    video_ids = kept["video_id"].unique().tolist()
    videos = catalog.videos(video_ids)
    sources = _sources(catalog, project.id, videos)
    kept["source_url"] = [sources[v][0] for v in kept["video_id"]]
    kept["sources"] = pd.Series([sources[v] for v in kept["video_id"]], dtype=object)
    kept["video_title"] = [videos[v].title for v in kept["video_id"]]
    has_detections = paths.detections_table.is_file() and project.config.detect is not None
    if has_detections:
        counts = pd.read_parquet(paths.detections_table).groupby("frame_id").size()
        kept["detections"] = kept["frame_id"].map(counts).fillna(0).astype("int64")
    else:
        kept["detections"] = pd.Series([None] * len(kept), dtype="Int64")
    prompt_columns = [
        c for c in kept.columns if c.startswith(("positive: ", "negative: ", "junk: "))
    ]
    manifest = kept[MANIFEST_COLUMNS + prompt_columns]

    staging = ctx.staging_path(paths.dataset_dir)
    released: list[Path] = []  # removed once the commit is done
    (staging / IMAGES_DIR).mkdir(parents=True)
    linked = place_images(
        zip(map(Path, kept["file"]), kept["file_name"], strict=True),
        staging / IMAGES_DIR,
        copy=False,
    )
    manifest.to_parquet(staging / MANIFEST_FILE, index=False)
    if has_detections:
        shutil.copy2(paths.coco_file, staging / COCO_FILE)
    ctx.log.info(
        f"dataset {project.name}: {len(manifest)} images ({linked} hard links) in {paths.dataset_dir}"
    )
    return ItemResult(
        metadata={
            **_sample_preview(staging, manifest, has_detections, paths.previews_dir),
            "images": len(manifest),
            "hard_links": linked,
            "copies": len(manifest) - linked,
            "dataset": paths.dataset_dir,
            "manifest": paths.dataset_dir / MANIFEST_FILE,
            "annotations": (
                paths.dataset_dir / COCO_FILE if has_detections else "none (no detect section)"
            ),
        },
        outcome={"images": len(manifest)},
        commit=lambda conn: released.extend(
            _publish(catalog, conn, project, staging, paths.dataset_dir)
        ),
        staged=released,
    )
