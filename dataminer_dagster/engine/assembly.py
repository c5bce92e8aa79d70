"""The pipeline's assets assembled from the registry: each stage's `@stage_asset` found in its
folder, optionally under a key prefix (a copy of the pipeline in a user's code location), and the
lanes' multi-assets."""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Mapping, Sequence

import dagster as dg

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.engine.stage_asset import StageAsset
from dataminer_dagster.engine.stage_run import lane_asset
from dataminer_dagster.lanes import DEFAULT_LANES, Lane
from dataminer_dagster.registry import StageRegistry


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
        lane.name: lane_asset(
            lane.name, [stages[s] for s in lane.stages], _backfill_policy(lane, lanes)
        )
        for lane in lanes
        if all(s in stages for s in lane.stages)
    }


def _backfill_policy(lane: Lane, lanes: Sequence[Lane]) -> dg.BackfillPolicy:
    """A backfill does a lane's partitions in one run, except those of a lane that reads another
    lane of its partition set (the backup reads the frames): in runs of its batch, which Dagster
    then never puts in one run with the lane it reads (a backfill runs assets of different
    backfill policies apart). In one run the reading lane's step would be skipped: a lane records
    a materialization per partition and no step output, and Dagster skips a step whose upstream
    step yielded no output for it (docs/architecture.md, "What Dagster is told")."""
    with warnings.catch_warnings():  # backfill_policy is marked beta
        warnings.simplefilter("ignore", dg.BetaWarning)
        if any(_reads_another_lane_of_its_set(lane, stage, lanes) for stage in lane.stages):
            return dg.BackfillPolicy.multi_run(lane.policy.batch)
        return dg.BackfillPolicy.single_run()


def _reads_another_lane_of_its_set(lane: Lane, stage: str, lanes: Sequence[Lane]) -> bool:
    reads = REGISTRY[stage].reads
    return (
        reads is not None
        and reads not in lane.stages
        and REGISTRY[reads].keys == REGISTRY[stage].keys
        and any(reads in other.stages for other in lanes)
    )


def config_specs(stages: Mapping[str, StageAsset]) -> list[dg.AssetSpec]:
    """The external config assets of the project-level stages (engine/config_versions.py)."""
    return [spec for s in stages.values() if (spec := s.config_spec()) is not None]


def pipeline_assets(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane] = DEFAULT_LANES
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    """What a code location holds of the pipeline: the lanes' multi-assets and the config assets
    upstream of the project-level stages."""
    return [*lane_assets(stages, lanes).values(), *config_specs(stages)]
