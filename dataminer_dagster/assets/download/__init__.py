"""download: fetch a video once for every project that links it (yt-dlp, polite per host)."""

from dataminer_dagster.registry import (
    CATALOG,
    DOWNLOAD,
    INGEST,
    VIDEO_LANE,
    VIDEOS,
    StageSpec,
)

STAGE = StageSpec(
    DOWNLOAD,
    VIDEOS,
    lane=VIDEO_LANE,
    asset="downloads",
    description="download a video",
    reads=CATALOG,
    # No config: a download serves every project linked to the video, so a project's `download:`
    # settings apply to the downloads still to come; a file already fetched is kept.
    group=INGEST,
    home=__name__,
    # A slow host's download must not hold up its batch; download.max_downloads_per_host still
    # bounds what one host sees, across every run.
    at_once=4,
)
