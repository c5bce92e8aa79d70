"""detections: objects on the kept frames, as a table and as COCO JSON.

ultralytics YOLO keeps the configured classes by name; OWLv2 and GroundingDINO detect the
configured text prompts. Boxes are pixels `[x, y, w, h]`; the COCO file lists every kept frame
(with or without boxes) under its dataset file name. Optional visualisations draw the boxes.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from dataminer_dagster.core.coco import ImageDetections, build_coco, coco_problems, write_coco
from dataminer_dagster.core.images import read_image, write_image
from dataminer_dagster.core.progress import Progress
from dataminer_dagster.core.visualize import contact_sheet, draw_detections
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.partition_checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.previews import preview_metadata
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.registry import DETECT

if TYPE_CHECKING:
    import pandas as pd

READ_CHUNK = 64  # frames read from disk at a time
# Threads reading and decoding the next chunk while the detector works on the current one: a GPU
# detector takes a chunk faster than one thread decodes it.
READ_THREADS = 4


def _detect_chunk(detector, chunk, pictures, config, staging, rows, images) -> None:
    """Detect on one chunk of kept frames; append its table rows and COCO images, and draw its
    visualisations."""
    for (_, frame), picture, found in zip(
        chunk.iterrows(), pictures, detector.detect(pictures), strict=True
    ):
        name = Path(frame["file"]).name
        images.append(ImageDetections(name, picture.shape[1], picture.shape[0], found))
        rows += [
            {
                "frame_id": frame["frame_id"],
                "file_name": name,
                "label": d.label,
                "score": d.score,
                "x": d.x,
                "y": d.y,
                "w": d.w,
                "h": d.h,
            }
            for d in found
        ]
        if config.visualizations and found:
            write_image(staging / "visualizations" / name, draw_detections(picture, found))


EXAMPLES = 8  # frames in the detections preview


def _examples(
    table: pd.DataFrame, kept: pd.DataFrame, paths: ProjectPaths, ctx: StageContext
) -> dict:
    """A contact sheet of the frames with the most detections, boxes and class names drawn; when
    there are fewer, kept frames without any, so that the preview shows what was looked at."""
    from dataminer_dagster.models.detectors import Detection

    busiest = table["frame_id"].value_counts().head(EXAMPLES).index.tolist()
    quiet = [f for f in kept["frame_id"] if f not in set(busiest)]
    quiet = quiet[: EXAMPLES - len(busiest)]
    files = dict(zip(kept["frame_id"], kept["file"], strict=True))
    pictures, captions = [], []
    for frame_id in busiest + quiet:
        boxes = table[table["frame_id"] == frame_id]
        found = [Detection(r.x, r.y, r.w, r.h, r.score, r.label) for r in boxes.itertuples()]
        pictures.append(draw_detections(read_image(Path(files[frame_id])), found))
        captions.append(
            f"{len(found) or 'no'} detection{'' if len(found) == 1 else 's'}: {frame_id}"
        )
    sheet = contact_sheet(
        pictures,
        captions,
        columns=4,
        tile_width=200,
        tile_height=150,
        empty="no kept frames to detect on",
    )
    return preview_metadata(
        "detection_examples",
        sheet,
        paths.previews_dir,
        ctx.staging_path,
        cover=pictures[0] if pictures else None,
    )


def _coco_valid(ctx: StageContext, project_name: str) -> CheckResult:
    project = ctx.catalog.projects.get(project_name)
    if project.config.detect is None:
        return CheckResult(True, {"images": 0, "annotations": 0, "invalid_annotations": 0})
    return check_coco_file(ProjectPaths(project.output_dir).coco_file)


def check_coco_file(path: Path) -> CheckResult:
    """The COCO file loads and is internally consistent: counts, and its problems in words."""
    if not path.is_file():
        return CheckResult(False, {}, f"The COCO file `{path}` is missing.")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return CheckResult(False, {}, f"The COCO file `{path}` is not readable JSON: {exc}")
    problems = coco_problems(document)
    bad_annotations = {p.split("]", 1)[0] for p in problems if p.startswith("annotations[")}
    sections = {k: document.get(k) for k in ("images", "annotations")}
    metrics = {
        **{k: len(v) if isinstance(v, list) else 0 for k, v in sections.items()},
        "invalid_annotations": len(bad_annotations),
        "other_problems": len([p for p in problems if not p.startswith("annotations[")]),
    }
    if not problems:
        return CheckResult(True, metrics)
    listed = "\n".join(f"- {p}" for p in problems[:10])
    more = f"\n- ... and {len(problems) - 10} more" if len(problems) > 10 else ""
    return CheckResult(
        False, metrics, f"The COCO file `{path}` has {len(problems)} problems:\n{listed}{more}"
    )


@stage_asset(
    checks=[
        PartitionCheck(
            "coco_valid",
            "The COCO file is valid detection JSON: every annotation names a listed image and a "
            "category, with a box inside its image.",
            _coco_valid,
        )
    ],
    stage=DETECT,
    required_resource_keys=["models"],
    kinds={"pytorch", "parquet", "json"},
    loadable=True,  # a downstream asset loads it (outputs.py)
)
def detections(item: StageItem, ctx: StageContext) -> ItemResult:
    """Detected objects on the kept frames: a table and a COCO file."""
    import pandas as pd

    project = ctx.catalog.projects.get(item.key)
    config = project.config.detect
    paths = ProjectPaths(project.output_dir)
    kept = pd.read_parquet(paths.dedup_table)
    kept = kept[kept["kept"]].reset_index(drop=True)
    if config is None:
        return ItemResult(
            metadata={
                "outcome": "nothing to do: the project config has no detect section",
                "frames": len(kept),
            }
        )

    started = time.monotonic()
    detector = ctx.models.detector(config)
    staging = ctx.staging_path(paths.detections_dir)
    staging.mkdir()
    if config.visualizations:
        (staging / "visualizations").mkdir()
    rows, images = [], []
    progress = Progress(f"detect {project.name}", len(kept), ctx.log.info, unit="frames")
    chunks = [kept.iloc[start : start + READ_CHUNK] for start in range(0, len(kept), READ_CHUNK)]
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="detect-read") as readers:

        def read_ahead(index: int) -> list[Future]:
            if index >= len(chunks):
                return []
            return [readers.submit(read_image, Path(f)) for f in chunks[index]["file"]]

        upcoming = read_ahead(0)
        for index, chunk in enumerate(chunks):
            ctx.check_lease(item)
            pictures = [future.result() for future in upcoming]
            upcoming = read_ahead(index + 1)  # read while the detector works on this chunk
            _detect_chunk(detector, chunk, pictures, config, staging, rows, images)
            progress.advance(len(chunk))

    table = pd.DataFrame(
        rows, columns=["frame_id", "file_name", "label", "score", "x", "y", "w", "h"]
    )
    table.to_parquet(staging / paths.detections_table.name, index=False)
    coco = build_coco(
        images, list(detector.labels), info={"description": f"dataminer project {project.name}"}
    )
    write_coco(coco, staging / paths.coco_file.name)
    per_label = table["label"].value_counts()
    model = Path(config.model)
    return ItemResult(
        metadata={
            **_examples(table, kept, paths, ctx),
            "frames": len(kept),
            "detections": len(table),
            "frames_with_detections": int(table["frame_id"].nunique()),
            "per_label": ", ".join(f"{k} {v}" for k, v in per_label.items()) or "none",
            "detector": config.detector,
            "model": model if model.is_absolute() else config.model,
            "detection_seconds": round(time.monotonic() - started, 2),
            "coco": paths.coco_file,
        },
        outcome={"frames": len(kept), "detections": len(table)},
        commit=lambda conn: file_changes(conn).publish(staging, paths.detections_dir),
    )
