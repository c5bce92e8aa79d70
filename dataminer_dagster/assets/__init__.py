"""The pipeline's stages, a folder each: `assets/<stage>/` holds the stage's registry entry
(`__init__.py`: its `STAGE`), its asset (`asset.py`), its config section (`config.py`), where it
has them its table (`table.py`) and its SQL (`store.py`), and its algorithm: plain modules that
know nothing of Dagster or SQL (the frames' sampling and decoding, dedup's grouping, the dataset's
formats and splits, the filter's rule).

`REGISTRY` lists the stages in flow order (dataminer_dagster/registry.py says what is derived
from it). Importing this package
imports only the stages' entries (no asset, no model library), so that the sensors, the database
layer and the CLI can read it.
"""

from dataminer_dagster.assets import (
    backup,
    catalog,
    dataset,
    dedup,
    detect,
    download,
    frames,
)
from dataminer_dagster.assets import filter as filtering
from dataminer_dagster.registry import StageRegistry

REGISTRY = StageRegistry(
    tuple(
        stage.STAGE
        for stage in (catalog, download, frames, filtering, dedup, detect, dataset, backup)
    )
)

# The per-video stages, for the SQL statements that are built once, at import.
VIDEO_STAGES = REGISTRY.video_stages
