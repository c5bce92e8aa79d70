"""frames: extract a video's frames, once per extraction profile the projects ask for."""

from dataminer_dagster.registry import (
    DOWNLOAD,
    FRAMES,
    INGEST,
    VIDEO_LANE,
    VIDEOS,
    StageSpec,
)

STAGE = StageSpec(
    FRAMES,
    VIDEOS,
    lane=VIDEO_LANE,
    asset="frames",
    description="extract a video's frames",
    reads=DOWNLOAD,
    group=INGEST,
    config=("extract",),
    home=__name__,
)
