"""The pipeline's stages, one module each, and the Dagster assets of their lanes.

`STAGES` maps work-item stages to their declared assets; `LANE_ASSETS` maps each lane (stages.py)
to the multi-asset that runs its stages in one step.
"""

from collections.abc import Mapping, Sequence

import dagster as dg

from dataminer_dagster.assets.backup import frames_backup
from dataminer_dagster.assets.catalog import video_catalog
from dataminer_dagster.assets.dataset import dataset
from dataminer_dagster.assets.dedup import deduped_set
from dataminer_dagster.assets.detect import detections
from dataminer_dagster.assets.downloads import downloads
from dataminer_dagster.assets.filter import filtered_frames
from dataminer_dagster.assets.frames import frames
from dataminer_dagster.assets.stage import StageAsset, lane_asset
from dataminer_dagster.stages import (
    BACKUP,
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
    LANES,
    Lane,
)

STAGES: dict[str, StageAsset] = {
    CATALOG: video_catalog,
    DOWNLOAD: downloads,
    FRAMES: frames,
    FILTER: filtered_frames,
    DEDUP: deduped_set,
    DETECT: detections,
    DATASET: dataset,
    BACKUP: frames_backup,
}


def lane_assets(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane] = LANES
) -> dict[str, dg.AssetsDefinition]:
    """The multi-asset of every lane whose stages are all in `stages`."""
    return {
        lane.name: lane_asset(lane.name, [stages[s] for s in lane.stages])
        for lane in lanes
        if all(s in stages for s in lane.stages)
    }


LANE_ASSETS = lane_assets(STAGES)
