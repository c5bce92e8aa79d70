"""dataset: what a user takes away from a project, in `<output>/dataset/`.

    images/                  the kept frames (hard links; copies only across devices)
    annotations.coco.json    the detections (when the project detects), file names relative to images/
    manifest.parquet         one row per kept frame: video, source URL, every source of the
                             video (its copies': the same content found elsewhere), timestamp,
                             size and rotation (how far the frame was turned upright), filter
                             scores, sharpness and brightness, dedup group and size, number of
                             detections, its split, and its review state
    coco/, yolo/, hf/        the training formats the config names (dataset.formats), per split
                             (assets/dataset/dataset_formats.py)
    report.md, report/       the quality report and its plots (assets/dataset/dataset_report.py)
    version.json             which version of the dataset this is (assets/dataset/dataset_versions.py)

A review in a labelling tool comes back as corrections (corrections.py, `dataminer review`): every
build applies them, leaving rejected images out and giving corrected ones the reviewer's boxes.

A build whose content differs from the last version's is kept as a new version, never changed
again, in `<output>/dataset_versions/v<N>/`, numbered by the database (store.py); `dataminer
dataset diff` compares two.

Splits are assigned by source (assets/dataset/dataset_splits.py): a video, its copies and the videos it
shares a near-duplicate group with (the dedup table's groups) go to one split, so no scene is in
two. Rebuilt aside on every run and put in place by two renames (the old folder aside, the new one
in) when the build is recorded: a reader finds the old dataset or the new one whole, or for an
instant none; a re-run replaces the dataset, never appends to it. Its checks (quality_checks.py)
read the files once they are in place; its previews are a sample of the images with their
annotations drawn, and the quality report's plots.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import numpy as np

from dataminer_dagster.assets.dataset.corrections import (
    AppliedReview,
    apply_review,
    load_corrections,
    review_imports,
)
from dataminer_dagster.assets.dataset.dataset_files import (
    COCO_FILE,
    IMAGES_DIR,
    MANIFEST_FILE,
    VERSION_FILE,
    place_images,
)
from dataminer_dagster.assets.dataset.dataset_formats import (
    REPORT_FILE,
    DatasetContents,
    read_contents,
    write_formats,
)
from dataminer_dagster.assets.dataset.dataset_report import (
    Thresholds,
    summarize,
    write_report,
)
from dataminer_dagster.assets.dataset.dataset_splits import assign_splits, shared_group_links
from dataminer_dagster.assets.dataset.dataset_versions import (
    build_version,
    next_version,
    version_folder,
)
from dataminer_dagster.assets.dataset.quality_checks import DATASET_CHECKS
from dataminer_dagster.assets.dataset.review_formats import REVIEW_STATES
from dataminer_dagster.assets.dataset.store import allocate_version_number, version_published
from dataminer_dagster.core.coco import Detection, write_coco
from dataminer_dagster.core.images import brightness_of_file, read_image
from dataminer_dagster.core.redact import redact_url
from dataminer_dagster.core.visualize import contact_sheet, draw_detections
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.db.project_flow import project_members
from dataminer_dagster.db.reports import source_yield
from dataminer_dagster.db.retention import release_finished_frames
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.previews import preview_metadata
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.registry import DATASET

if TYPE_CHECKING:
    import pandas as pd


def _sources(catalog, project_id: int, videos: dict) -> dict[str, list[str]]:
    """Every URL or path the project found each video at: its own and its copies', in the order
    the project linked them (a dataset travels: no passwords or signed tokens in them)."""
    found = catalog.videos.project_sources(project_id, videos)
    return {
        video_id: [
            redact_url(url) if url else path
            for url, path in found.get(video_id) or [(video.url, video.source_path)]
        ]
        for video_id, video in videos.items()
    }


YIELD_COLUMNS = {  # source_yield's keys, and their type in the UI's table
    "source": "string",
    "videos": "int",
    "downloaded": "int",
    "downloaded_minutes": "float",
    "frames_extracted": "int",
    "frames_passed": "int",
    "frames_kept": "int",
    "kept_per_video": "float",
    "kept_per_minute": "float",
}


def _yield_metadata(yields: list[dict]) -> dg.TableMetadataValue:
    """The project's yield per source as a table the UI shows (db/reports.py `source_yield`)."""
    return dg.MetadataValue.table(
        records=[dg.TableRecord({k: y[k] for k in YIELD_COLUMNS}) for y in yields],
        schema=dg.TableSchema(
            columns=[dg.TableColumn(name, kind) for name, kind in YIELD_COLUMNS.items()]
        ),
    )


def _produced_by(project, imports: list[dict]) -> dict:
    """What a version records of what made it: the config's fingerprints, the model ids and the
    review imports applied."""
    config = project.config
    return {
        "fingerprints": config.fingerprints(),
        "filter_model": config.filter.model,
        "detector": None
        if config.detect is None
        else f"{config.detect.detector} {config.detect.model}",
        "review_imports": [
            {k: i[k] for k in ("imported_at", "sha256", "format", "images")} for i in imports
        ],
    }


def _publish(
    catalog,
    conn,
    project,
    paths: ProjectPaths,
    staging: Path,
    kept: tuple[Path, Path, int] | None,
) -> None:
    """Publish the dataset and, where it is a new version, its version folder (`kept`: staged,
    final, number), and release the members' frames: on disk only if the transaction commits
    (db/file_changes.py)."""
    changes = file_changes(conn)
    changes.publish(staging, paths.dataset_dir)
    if kept is not None:
        staged, final, number = kept
        if not final.exists():  # a kept version is never changed again
            changes.publish(staged, final)
        version_published(conn, project.id, [number])
    members = [row.video_id for row in project_members(catalog.engine, project.id)]
    release_finished_frames(catalog, conn, members, completing=project.name)


def _new_version_number(catalog, project, paths: ProjectPaths, item: StageItem) -> int:
    with catalog.engine.begin() as conn:
        return allocate_version_number(
            conn, project.id, paths.dataset_versions_dir, item.lease.token
        )


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
    "brightness",
    "group",
    "group_size",
    "detections",
    "split",
    "review",
]


SAMPLE_SIZE = 8  # images in the dataset's preview


def _sample_preview(
    staging: Path, contents: DatasetContents, previews: Path, ctx: StageContext
) -> dict:
    """A sample of the dataset's images with their annotations drawn (the images with the most
    annotations first)."""
    with_boxes = contents.names is not None
    names = contents.names or []
    boxes = {
        image.file_name: [
            Detection(b.x, b.y, b.w, b.h, 1.0 if b.score is None else b.score, names[b.category])
            for b in image.boxes
        ]
        for image in contents.images
    }
    sample = sorted(boxes, key=lambda name: (-len(boxes[name]), name))[:SAMPLE_SIZE]
    pictures = [
        draw_detections(read_image(staging / IMAGES_DIR / name), boxes[name]) for name in sample
    ]
    what = "annotations" if with_boxes else "images (no detect section: no annotations)"
    captions = [
        f"{len(boxes[name])} box{'' if len(boxes[name]) == 1 else 'es'}: {name}"
        if with_boxes
        else name
        for name in sample
    ]
    sheet = contact_sheet(
        pictures, captions, columns=4, tile_width=200, tile_height=150, empty=f"no {what}"
    )
    return preview_metadata(
        "dataset_sample",
        sheet,
        previews,
        ctx.staging_path,
        cover=pictures[0] if pictures else None,
    )


def _split(kept: pd.DataFrame, table: pd.DataFrame, videos: dict, config):
    """The split of each source video: whole units of a video, its copies and the videos it
    shares a dedup group with (every frame of the dedup table counts, not only the kept ones: a
    dropped frame is the near-duplicate of a kept one in another video)."""
    links = shared_group_links(zip(table["video_id"], table["group"], strict=True))
    links += [(v, row.same_as) for v, row in videos.items() if row.same_as]
    return assign_splits(
        kept.groupby("video_id").size().to_dict(),
        links,
        config.splits.model_dump(),
        config.seed,
    )


def _measure_brightness(kept: pd.DataFrame) -> pd.Series:
    """The frames' brightness; measured now from the file for frames extracted before extraction
    measured it."""
    brightness = kept["brightness"].astype(np.float64)
    missing = brightness.isna()
    brightness[missing] = [brightness_of_file(Path(f)) for f in kept.loc[missing, "file"]]
    return brightness


def _manifest(catalog, project, paths: ProjectPaths, table: pd.DataFrame):
    """The kept frames of the dedup table with everything the manifest says of them, their split
    included; and the split assignment (its warnings)."""
    import pandas as pd

    kept = table[table["kept"]].reset_index(drop=True)
    if "rotation" not in kept:  # a dedup table from before frames were turned: none was
        kept["rotation"] = 0
    if "brightness" not in kept:  # ... from before extraction measured it
        kept["brightness"] = np.nan
    kept["brightness"] = _measure_brightness(kept)
    kept["file_name"] = [Path(f).name for f in kept["file"]]

    video_ids = kept["video_id"].unique().tolist()
    videos = catalog.videos.get(video_ids)
    sources = _sources(catalog, project.id, videos)
    kept["source_url"] = [sources[v][0] for v in kept["video_id"]]
    kept["sources"] = pd.Series([sources[v] for v in kept["video_id"]], dtype=object)
    kept["video_title"] = [videos[v].title for v in kept["video_id"]]
    if _has_detections(project, paths):
        counts = pd.read_parquet(paths.detections_table).groupby("frame_id").size()
        kept["detections"] = kept["frame_id"].map(counts).fillna(0).astype("int64")
    else:
        kept["detections"] = pd.Series([None] * len(kept), dtype="Int64")
    splits = _split(kept, table, videos, project.config.dataset)
    kept["split"] = kept["video_id"].map(splits.split_of)
    return kept, splits


REVIEW_COLUMNS = {
    "class": "string",
    "predicted": "int",
    "unchanged": "int",
    "moved": "int",
    "relabelled": "int",
    "deleted": "int",
    "added": "int",
    "correction_rate": "float",
}


def _review_metadata(review: AppliedReview) -> dict:
    """The review's counts, and its changes per class as a table the UI shows; nothing before
    the first review import."""
    summary = review.summary
    if not summary.reviewed:
        return {}
    rows = [
        dg.TableRecord(
            {
                "class": name,
                "predicted": c.predicted,
                "unchanged": c.unchanged,
                "moved": c.moved,
                "relabelled": c.relabelled,
                "deleted": c.deleted,
                "added": c.added,
                "correction_rate": round(c.rate, 4),
            }
        )
        for name, c in sorted(summary.classes.items())
    ]
    return {
        **{f"review_{state}": summary.states[state] for state in REVIEW_STATES},
        "review_per_class": dg.MetadataValue.table(
            records=rows,
            schema=dg.TableSchema(
                columns=[dg.TableColumn(name, kind) for name, kind in REVIEW_COLUMNS.items()]
            ),
        ),
    }


def _reviewed(
    kept: pd.DataFrame, paths: ProjectPaths, has_detections: bool
) -> tuple[pd.DataFrame, AppliedReview]:
    """The kept frames with the review's corrections applied (corrections.py): rejected ones out,
    each one's review state, and the boxes of the reviewed ones counted from the reviewed
    annotations."""
    review = apply_review(
        json.loads(paths.coco_file.read_text()) if has_detections else None,
        kept["file_name"],
        load_corrections(paths.review_dir),
    )
    kept = kept[~kept["file_name"].isin(review.rejected)].reset_index(drop=True)
    kept["review"] = kept["file_name"].map(review.states)
    if review.summary.reviewed and review.coco is not None:
        kept["detections"] = _boxes_per_image(review.coco, kept["file_name"])
    return kept, review


def _boxes_per_image(coco: dict, file_names: pd.Series) -> pd.Series:
    """How many boxes each image has in `coco` (a reviewed image: the reviewer's)."""
    import pandas as pd

    file_of = {i["id"]: i["file_name"] for i in coco["images"]}
    counts = pd.Series([file_of[a["image_id"]] for a in coco["annotations"]]).value_counts()
    return file_names.map(counts).fillna(0).astype("int64")


def _has_detections(project, paths: ProjectPaths) -> bool:
    return paths.detections_table.is_file() and project.config.detect is not None


def _quality_report(
    project, manifest, contents, table, formats, warnings, staging: Path, yields, review
):
    """The report's numbers, and its files in `staging`; returns (numbers, overview picture)."""
    config = project.config
    report = summarize(
        manifest,
        contents.images,
        contents.names,
        zip(table["video_id"], table["group"], strict=True),
        ratios=config.dataset.splits.model_dump(),
        seed=config.dataset.seed,
        thresholds=Thresholds(
            config.dataset.blurry_below,
            config.dataset.dark_below,
            config.dataset.overexposed_above,
            config.filter.positive_threshold,
            config.detect.confidence if config.detect else None,
        ),
        warnings=warnings,
        review=review.summary if review.summary.reviewed else None,
    )
    overview = write_report(
        report,
        manifest,
        contents.images,
        staging,
        title=f"dataset of project {project.name}",
        formats=formats.images,
        yields=yields,
    )
    return report, overview


@stage_asset(
    stage=DATASET,
    kinds={"image", "parquet", "json"},
    loadable=True,  # a downstream asset loads it (outputs.py)
    checks=DATASET_CHECKS,
)
def dataset(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's dataset: kept images split by source, a Parquet manifest, COCO annotations,
    the training formats of its config and a quality report."""
    import pandas as pd

    catalog = ctx.catalog
    project = catalog.projects.get(item.key)
    config = project.config.dataset
    paths = ProjectPaths(project.output_dir)
    table = pd.read_parquet(paths.dedup_table)
    kept, splits = _manifest(catalog, project, paths, table)
    has_detections = _has_detections(project, paths)
    kept, review = _reviewed(kept, paths, has_detections)
    prompt_columns = [
        c for c in kept.columns if c.startswith(("positive: ", "negative: ", "junk: "))
    ]
    manifest = kept[MANIFEST_COLUMNS + prompt_columns]

    staging = ctx.staging_path(paths.dataset_dir)
    (staging / IMAGES_DIR).mkdir(parents=True)
    linked = place_images(
        zip(map(Path, kept["file"]), kept["file_name"], strict=True),
        staging / IMAGES_DIR,
        copy=False,
    )
    manifest.to_parquet(staging / MANIFEST_FILE, index=False)
    if review.coco is not None:
        write_coco(review.coco, staging / COCO_FILE)
    contents = read_contents(staging)
    imports = review_imports(paths.review_dir)
    version, new_version = next_version(
        paths.dataset_versions_dir,
        contents,
        _produced_by(project, imports),
        allocate=lambda: _new_version_number(catalog, project, paths, item),
    )
    (staging / VERSION_FILE).write_text(json.dumps(version.as_json(), indent=2) + "\n")
    formats = write_formats(staging, contents, config.formats, published_at=paths.dataset_dir)
    warnings = [*splits.warnings, *formats.notes]
    if review.unknown_classes:
        warnings.append(
            "reviewed boxes of classes the detect section does not have (any more) were left "
            "out: " + ", ".join(review.unknown_classes)
        )
    for warning in warnings:
        ctx.log.warning(f"dataset {project.name}: {warning}")
    yields = source_yield(catalog.engine, project.id)
    report, overview = _quality_report(
        project, manifest, contents, table, formats, warnings, staging, yields, review
    )
    kept_version = None
    if new_version:
        final = version_folder(paths.dataset_versions_dir, version.number)
        kept_version = (ctx.staging_path(final), final, version.number)
        build_version(staging, kept_version[0], version)
    minutes = sum(y["downloaded_minutes"] for y in yields)
    ctx.log.info(
        f"dataset {project.name} v{version.number}"
        f"{'' if new_version else ' (the same content as before)'}: "
        f"{len(manifest)} images ({linked} hard links) in "
        f"{paths.dataset_dir}: "
        + ", ".join(f"{s} {n}" for s, n in report.per_split.items())
        + (f"; formats {', '.join(config.formats)}" if config.formats else "")
    )
    return ItemResult(
        metadata={
            **_sample_preview(staging, contents, paths.previews_dir, ctx),
            **preview_metadata(
                "quality_report", overview, paths.previews_dir, ctx.staging_path, chart=True
            ),
            "images": len(manifest),
            "version": version.number,
            "new_version": new_version,
            **{f"{s}_images": n for s, n in report.per_split.items()},
            "hard_links": linked,
            "copies": len(manifest) - linked,
            "dataset": paths.dataset_dir,
            "manifest": paths.dataset_dir / MANIFEST_FILE,
            "annotations": (
                paths.dataset_dir / COCO_FILE if has_detections else "none (no detect section)"
            ),
            "formats": ", ".join(formats.images) or "none",
            "report": paths.dataset_dir / REPORT_FILE,
            "near_duplicate_pairs_across_splits": report.pairs_across_splits,
            "blurry": report.blurry,
            "dark": report.dark,
            "overexposed": report.overexposed,
            "kept_per_download_minute": (
                sum(y["frames_kept"] for y in yields) / minutes if minutes else None
            ),
            "yield_per_source": _yield_metadata(yields),
            **_review_metadata(review),
            **({"warnings": "\n".join(warnings)} if warnings else {}),
        },
        outcome={"images": len(manifest), "version": version.number, **report.per_split},
        commit=lambda conn: _publish(catalog, conn, project, paths, staging, kept_version),
    )
