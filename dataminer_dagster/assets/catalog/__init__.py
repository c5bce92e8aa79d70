"""catalog: find a project's videos (searches, URL lists, files) and link them to it."""

from dataminer_dagster.registry import CATALOG, CATALOG_LANE, INGEST, PROJECTS, StageSpec

STAGE = StageSpec(
    CATALOG,
    PROJECTS,
    lane=CATALOG_LANE,
    asset="video_catalog",
    description="find a project's videos, link them",
    group=INGEST,
    config=("inputs",),
    home=__name__,
)
