"""The pipeline's stages, one module each. `STAGE_ASSETS` maps work-item stages to their assets."""

from dataminer_dagster.assets.backup import frames_backup
from dataminer_dagster.assets.catalog import video_catalog
from dataminer_dagster.assets.dataset import dataset
from dataminer_dagster.assets.dedup import deduped_set
from dataminer_dagster.assets.detect import detections
from dataminer_dagster.assets.downloads import downloads
from dataminer_dagster.assets.filter import filtered_frames
from dataminer_dagster.assets.frames import frames
from dataminer_dagster.stages import (
    BACKUP,
    CATALOG,
    DATASET,
    DEDUP,
    DETECT,
    DOWNLOAD,
    FILTER,
    FRAMES,
)

STAGE_ASSETS = {
    CATALOG: video_catalog,
    DOWNLOAD: downloads,
    FRAMES: frames,
    FILTER: filtered_frames,
    DEDUP: deduped_set,
    DETECT: detections,
    DATASET: dataset,
    BACKUP: frames_backup,
}
