"""What `dataset`, `deduped_set` and `detections` give a downstream asset: a small typed value per
project partition that names the stage's files (the files stay where the stage wrote them; the
tables are read only when asked for).

    import dagster as dg
    from dataminer_dagster.outputs import Dataset, projects_partitions

    @dg.asset(partitions_def=projects_partitions, ins={"dataset": dg.AssetIn()})
    def training_split(context: dg.AssetExecutionContext, dataset: Dataset) -> None:
        manifest = dataset.read_manifest()            # pandas; read_manifest_arrow(): pyarrow
        train = dataset.read_split("train")           # the manifest's rows of one split
        context.log.info(f"{dataset.splits['train']} of {dataset.images} images to train on")

The stages' IO manager (`resources/stage_outputs.py`, key `OUTPUTS_IO_MANAGER_KEY`, carried by the lane
asset: no code location needs to add it) builds the value from the project's row in the claim
database of the `db` resource. An asset partitioned like the pipeline's
project assets (`projects_partitions`) gets one value; an unpartitioned one (or a run over a range
of projects) gets a dict, project name -> value, of the projects whose output exists. Under
`build_definitions(prefix=...)` name the asset with its prefix: `dg.AssetIn(key=["dm", "dataset"])`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE
from dataminer_dagster.assets.dataset.dataset_formats import (
    COCO_SPLITS_DIR,
    HF_DIR,
    HF_SPLIT_DIRS,
    REPORT_FILE,
    YOLO_DATA_YAML,
    YOLO_DIR,
)
from dataminer_dagster.assets.dataset.dataset_splits import SPLITS
from dataminer_dagster.partitions import projects_partitions
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.registry import DATASET, DEDUP, DETECT

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

OUTPUTS_IO_MANAGER_KEY = "dataminer_outputs"

__all__ = [
    "OUTPUTS_IO_MANAGER_KEY",
    "Dataset",
    "DedupedSet",
    "Detections",
    "OutputMissing",
    "load_output",
    "projects_partitions",
]


class OutputMissing(FileNotFoundError):
    """A project's stage has not written its output (yet)."""


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.read_metadata(path).num_rows


def _frame(path: Path) -> pd.DataFrame:
    import pandas as pd

    return pd.read_parquet(path)


def _table(path: Path) -> pa.Table:
    import pyarrow.parquet as pq

    return pq.read_table(path)


@dataclass(frozen=True)
class Dataset:
    """A project's dataset (`<output_dir>/dataset/`): the kept images, their Parquet manifest
    (one row per image: video, source, timestamp, scores, duplicate group, detections, split),
    when the project detects the COCO annotations, the training formats its config names, per
    split, and the quality report."""

    project: str
    images_dir: Path
    manifest_path: Path
    coco_path: Path | None  # None: the project has no detect section
    images: int  # rows of the manifest
    # split -> images (train, val, test; 0 for an empty split); empty for a dataset made before
    # splits, which the next `dataminer run` makes again
    splits: dict[str, int]
    coco_splits: dict[str, Path]  # split -> coco/<split>.json, for the splits written
    yolo_dir: Path | None  # yolo/ (images/<split>/, labels/<split>/), None when not written
    yolo_data_yaml: Path | None  # None when not written (no yolo, or an empty train or val)
    hf_dir: Path | None  # hf/, `datasets.load_dataset("imagefolder", data_dir=hf_dir)`
    report_path: Path | None  # report.md, with its plots in report/

    def read_manifest(self) -> pd.DataFrame:
        return _frame(self.manifest_path)

    def read_manifest_arrow(self) -> pa.Table:
        return _table(self.manifest_path)

    def read_split(self, split: str) -> pd.DataFrame:
        """The manifest's rows of one split (train, val or test)."""
        if split not in SPLITS:
            raise ValueError(f"no split {split!r}; the splits are {', '.join(SPLITS)}")
        manifest = self.read_manifest()
        return manifest[manifest["split"] == split].reset_index(drop=True)

    def read_coco(self) -> dict:
        if self.coco_path is None:
            raise OutputMissing(f"project {self.project} has no detect section: no COCO file")
        return json.loads(self.coco_path.read_text())


@dataclass(frozen=True)
class DedupedSet:
    """A project's deduplication (`<output_dir>/dedup/frames.parquet`): every frame that passed
    the filter with its duplicate group, whether it is kept, and its scores."""

    project: str
    table_path: Path
    frames: int  # rows of the table

    def read_table(self) -> pd.DataFrame:
        return _frame(self.table_path)

    def read_table_arrow(self) -> pa.Table:
        return _table(self.table_path)

    def read_kept(self) -> pd.DataFrame:
        """The kept frames only: one per group of near-duplicates."""
        table = self.read_table()
        return table[table["kept"]].reset_index(drop=True)


@dataclass(frozen=True)
class Detections:
    """A project's detections (`<output_dir>/detections/`): one table row per box (pixels
    `[x, y, w, h]`), the COCO file over every kept frame, and the drawn boxes when the project
    asks for visualisations."""

    project: str
    table_path: Path
    coco_path: Path
    visualizations_dir: Path | None
    boxes: int  # rows of the table

    def read_table(self) -> pd.DataFrame:
        return _frame(self.table_path)

    def read_table_arrow(self) -> pa.Table:
        return _table(self.table_path)

    def read_coco(self) -> dict:
        return json.loads(self.coco_path.read_text())


StageOutput = Dataset | DedupedSet | Detections
LOADABLE_STAGES = (DEDUP, DETECT, DATASET)


def load_output(stage: str, project: str, output_dir: Path) -> StageOutput:
    """The output of `stage` for `project` (whose results live in `output_dir`), as it is on disk;
    OutputMissing when its files are not there."""
    paths = ProjectPaths(Path(output_dir))
    if stage == DATASET:
        root = paths.dataset_dir
        manifest = _present(root / MANIFEST_FILE, stage, project)
        coco = root / COCO_FILE
        yolo = root / YOLO_DIR
        hf = root / HF_DIR
        return Dataset(
            project,
            root / IMAGES_DIR,
            manifest,
            coco if coco.is_file() else None,
            _rows(manifest),
            splits=_split_sizes(manifest),
            coco_splits={
                s: root / COCO_SPLITS_DIR / f"{s}.json"
                for s in SPLITS
                if (root / COCO_SPLITS_DIR / f"{s}.json").is_file()
            },
            yolo_dir=yolo if yolo.is_dir() else None,
            yolo_data_yaml=_if_file(yolo / YOLO_DATA_YAML),
            hf_dir=hf if any((hf / d).is_dir() for d in HF_SPLIT_DIRS.values()) else None,
            report_path=_if_file(root / REPORT_FILE),
        )
    if stage == DEDUP:
        table = _present(paths.dedup_table, stage, project)
        return DedupedSet(project, table, _rows(table))
    if stage == DETECT:
        table = _present(paths.detections_table, stage, project)
        drawn = paths.detections_dir / "visualizations"
        return Detections(
            project,
            table,
            _present(paths.coco_file, stage, project),
            drawn if drawn.is_dir() else None,
            _rows(table),
        )
    raise ValueError(
        f"stage {stage!r} has no loadable output; these do: {', '.join(LOADABLE_STAGES)}"
    )


def _split_sizes(manifest: Path) -> dict[str, int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if "split" not in pq.read_schema(manifest).names:  # made before splits
        return {}
    table = pq.read_table(manifest, columns=["split"])
    return {s: int(pc.sum(pc.equal(table["split"], s)).as_py() or 0) for s in SPLITS}


def _if_file(path: Path) -> Path | None:
    return path if path.is_file() else None


def _present(path: Path, stage: str, project: str) -> Path:
    if not path.is_file():
        raise OutputMissing(f"the {stage} stage of project {project} has not written {path} yet")
    return path
