"""dataset: what a user takes away from a project, in `<output>/dataset/`.

    images/                  the kept frames (hard links; copies only across devices)
    annotations.coco.json    the detections (when the project detects), file names relative to images/
    manifest.parquet         one row per kept frame: video, source URL, timestamp, filter scores,
                             dedup group and size, number of detections

Rebuilt atomically on every run: a re-run replaces the dataset, never appends to it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from dataminer_dagster.assets.detect import detections
from dataminer_dagster.assets.stage import (
    ItemResult,
    StageContext,
    StageItem,
    stage_asset,
)
from dataminer_dagster.core.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE, place_images
from dataminer_dagster.core.files import publish, staging_path
from dataminer_dagster.core.redact import redact_url
from dataminer_dagster.db.project_flow import project_members
from dataminer_dagster.db.retention import release_finished_frames
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.stages import DATASET


def _publish(catalog, conn, project, staging: Path, final: Path) -> None:
    publish(staging, final)
    members = [row.video_id for row in project_members(catalog.engine, project.id)]
    release_finished_frames(catalog, conn, members, completing=project.name)


MANIFEST_COLUMNS = [
    "file_name",
    "video_id",
    "source_url",
    "video_title",
    "frame_index",
    "timestamp",
    "width",
    "height",
    "pos_max",
    "best_prompt",
    "sharpness",
    "group",
    "group_size",
    "detections",
]


@stage_asset(stage=DATASET, deps=[detections], kinds={"parquet"})
def dataset(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's dataset: kept images, COCO annotations and a Parquet manifest."""
    catalog = ctx.catalog
    project = catalog.project(item.key)
    paths = ProjectPaths(project.output_dir)
    kept = pd.read_parquet(paths.dedup_table)
    kept = kept[kept["kept"]].reset_index(drop=True)
    kept["file_name"] = [Path(f).name for f in kept["file"]]

    videos = catalog.videos(kept["video_id"].unique().tolist())
    kept["source_url"] = [  # a dataset travels: no passwords or signed tokens in it
        redact_url(videos[v].url) if videos[v].url else videos[v].source_path
        for v in kept["video_id"]
    ]
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

    staging = staging_path(paths.dataset_dir)
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
            "images": len(manifest),
            "hard_links": linked,
            "copies": len(manifest) - linked,
            "annotations": COCO_FILE if has_detections else "none (no detect section)",
            "path": str(paths.dataset_dir),
        },
        outcome={"images": len(manifest)},
        commit=lambda conn: _publish(catalog, conn, project, staging, paths.dataset_dir),
        staged=[staging],
    )
