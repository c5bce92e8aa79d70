"""The registry's stage assets and lane multi-assets, built once for the tests as definitions.py
builds them (without reading the settings or the executor choice)."""

from dataminer_dagster.engine.assembly import lane_assets, pipeline_assets, stage_assets

STAGES = stage_assets()
LANE_ASSETS = lane_assets(STAGES)
# What definitions.py puts in a code location: the lanes and the projects' config assets.
PIPELINE_ASSETS = pipeline_assets(STAGES)
