"""frames: extract a video's frames, once per extraction profile the projects ask for."""

from dataminer_dagster.engine.registry import DOWNLOAD, FRAMES, INGEST, VIDEOS, StageSpec

STAGE = StageSpec(
    FRAMES,
    VIDEOS,
    lane="video",
    asset="frames",
    description="extract a video's frames",
    reads=DOWNLOAD,
    group=INGEST,
    config=("extract",),
    home=__name__,
)
