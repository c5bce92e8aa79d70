"""The pipeline's assets assembled from the registry: each stage's `@stage_asset` found in its
folder, optionally under a key prefix (a copy of the pipeline in a user's code location), and the
lanes' multi-assets."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping, Sequence

import dagster as dg

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.engine.lanes import DEFAULT_LANES, Lane
from dataminer_dagster.engine.registry import StageRegistry
from dataminer_dagster.engine.stage import StageAsset, lane_asset


def stage_assets(registry: StageRegistry = REGISTRY) -> dict[str, StageAsset]:
    """Every registered stage's asset, by stage name, in flow order: the `@stage_asset` of each
    stage in its folder's `asset.py`."""
    found = {}
    for spec in registry.specs:
        module = importlib.import_module(f"{spec.home}.asset")
        assets = [
            a for a in vars(module).values() if isinstance(a, StageAsset) and a.stage == spec.name
        ]
        if len(assets) != 1:
            raise TypeError(
                f"{module.__name__} declares {len(assets)} @stage_asset of stage {spec.name!r}; "
                "a stage's asset.py declares exactly one"
            )
        found[spec.name] = assets[0]
    return found


def with_key_prefix(
    stages: Mapping[str, StageAsset], prefix: Sequence[str], group: str | None = None
) -> dict[str, StageAsset]:
    """The stages with their asset keys (and their dependencies on one another) under `prefix`,
    and every asset in `group` when one is given: a copy of the pipeline whose names cannot
    collide with a code location's own (definitions.build_definitions)."""
    own = {s.key for s in stages.values()}

    def moved(dep: dg.AssetKey | dg.AssetDep) -> dg.AssetKey | dg.AssetDep:
        key = dep.asset_key if isinstance(dep, dg.AssetDep) else dep
        if key not in own:
            return dep
        if isinstance(dep, dg.AssetDep):
            return dg.AssetDep(
                key.with_prefix(list(prefix)), partition_mapping=dep.partition_mapping
            )
        return key.with_prefix(list(prefix))

    return {
        name: dataclasses.replace(
            s,
            key_prefix=(*prefix, *s.key_prefix),
            deps=tuple(moved(d) for d in s.deps),
            group_name=group or s.group_name,
        )
        for name, s in stages.items()
    }


def lane_assets(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane] = DEFAULT_LANES
) -> dict[str, dg.AssetsDefinition]:
    """The multi-asset of every lane whose stages are all in `stages`."""
    return {
        lane.name: lane_asset(lane.name, [stages[s] for s in lane.stages])
        for lane in lanes
        if all(s in stages for s in lane.stages)
    }


def config_specs(stages: Mapping[str, StageAsset]) -> list[dg.AssetSpec]:
    """The external config assets of the project-level stages (engine/config_versions.py)."""
    return [spec for s in stages.values() if (spec := s.config_spec()) is not None]


def pipeline_assets(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane] = DEFAULT_LANES
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    """What a code location holds of the pipeline: the lanes' multi-assets and the config assets
    upstream of the project-level stages."""
    return [*lane_assets(stages, lanes).values(), *config_specs(stages)]
