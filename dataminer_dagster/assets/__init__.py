"""The pipeline's stages, one module each, and the Dagster assets of their lanes.

`stage_assets()` imports each registered stage's asset (stages.py: `StageSpec.asset`);
`lane_assets` makes the multi-asset that runs a lane's stages in one step.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence

import dagster as dg

from dataminer_dagster.assets.stage import StageAsset, lane_asset
from dataminer_dagster.stages import LANES, REGISTRY, Lane


def stage_assets() -> dict[str, StageAsset]:
    """Every registered stage's asset, by stage name, in flow order."""
    found = {}
    for spec in REGISTRY.specs:
        module, _, name = spec.asset.partition(":")
        asset = getattr(importlib.import_module(module), name)
        if not isinstance(asset, StageAsset) or asset.stage != spec.name:
            raise TypeError(f"{spec.asset} is not the @stage_asset of stage {spec.name!r}")
        found[spec.name] = asset
    return found


def lane_assets(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane] = LANES
) -> dict[str, dg.AssetsDefinition]:
    """The multi-asset of every lane whose stages are all in `stages`."""
    return {
        lane.name: lane_asset(lane.name, [stages[s] for s in lane.stages])
        for lane in lanes
        if all(s in stages for s in lane.stages)
    }


STAGES = stage_assets()
LANE_ASSETS = lane_assets(STAGES)
