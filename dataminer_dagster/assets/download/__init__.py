"""download: fetch a video once for every project that links it (yt-dlp, polite per host)."""

from dataminer_dagster.engine.registry import CATALOG, DOWNLOAD, INGEST, VIDEOS, StageSpec

STAGE = StageSpec(
    DOWNLOAD,
    VIDEOS,
    lane="video",
    asset="downloads",
    description="download a video",
    reads=CATALOG,
    group=INGEST,
    home=__name__,
)
