"""Declaring a stage: one function `(item, ctx) -> ItemResult` declared as a dynamically
partitioned asset by `@stage_asset` (`StageAsset`: its spec, its checks, its config asset). The
stages of a lane (registry.py) become one Dagster multi-asset, `lane_asset`
(engine/stage_run.py), whose step runs each selected stage in turn."""

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.db.project_records import stage_fingerprint
from dataminer_dagster.engine.config_versions import provenance_tags
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.partition_checks import PartitionCheck
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.outputs import OUTPUTS_IO_MANAGER_KEY
from dataminer_dagster.partitions import PARTITIONS
from dataminer_dagster.registry import PROJECTS
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.tags import GPU_OP_TAGS, GPU_POOL, STAGE_TAG


class StageConfig(dg.Config):
    redo: bool = False
    """Process items again even when they are already done, dead or blocked."""


StageFunction = Callable[[StageItem, StageContext], ItemResult]
# Of the partitions that have no work item of the stage, those the stage has nothing to do for,
# each with the metadata that says why (`stage_asset(nothing_to_do=...)`).
NothingToDo = Callable[[StageContext, Sequence[str]], Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class StageAsset:
    """A stage's asset, declared by `@stage_asset`: its per-item function and everything Dagster
    shows about it. The stages of a lane become one multi-asset (`lane_asset`), so that one run
    carries a batch of partitions through them all in one step."""

    name: str
    stage: str
    process: StageFunction
    partitions_def: dg.PartitionsDefinition
    description: str | None
    deps: tuple[dg.AssetDep, ...]
    required_resource_keys: frozenset[str]
    op_tags: Mapping[str, Any]
    pool: str | None
    kinds: frozenset[str]
    group_name: str
    checks: tuple[PartitionCheck, ...]
    # Its output loads as the input of another asset (outputs.py, the stages' IO manager).
    loadable: bool = False
    key_prefix: tuple[str, ...] = ()  # build_definitions(prefix=...)
    # A project-level stage: its asset depends on its config asset (engine/config_versions.py).
    config_versioned: bool = False
    nothing_to_do: NothingToDo | None = None

    @property
    def key(self) -> dg.AssetKey:
        return dg.AssetKey([*self.key_prefix, self.name])

    @property
    def config_key(self) -> dg.AssetKey | None:
        """The external asset whose data version, per project, is this stage's fingerprint of
        the project's config."""
        if not self.config_versioned:
            return None
        return dg.AssetKey([*self.key_prefix, f"{self.name}_config"])

    def config_spec(self) -> dg.AssetSpec | None:
        if self.config_key is None:
            return None
        return dg.AssetSpec(
            self.config_key,
            description=f"The project's config as {self.name} reads it: its data version is the "
            f"fingerprint of the sections {self.name} depends on. A partition of {self.name} "
            "done under another version is stale.",
            partitions_def=self.partitions_def,
            group_name=self.group_name,
            kinds={"yaml"},
        )

    def provenance(
        self, context: dg.AssetExecutionContext, partition: str, fingerprint: str | None
    ) -> dict[str, str] | None:
        """Dagster's provenance tags of a materialization done with the config of `fingerprint`
        (none where the stage has no config asset or the item no fingerprint)."""
        if self.config_key is None or fingerprint is None:
            return None
        db: DatabaseResource = context.resources.db
        current = stage_fingerprint(db.store.engine, partition, self.stage)
        parents = [d.asset_key for d in self.deps]
        return provenance_tags(
            context.instance, self.config_key, partition, fingerprint, current, parents
        )

    def spec(self) -> dg.AssetSpec:
        config = [dg.AssetDep(self.config_key)] if self.config_key is not None else []
        spec = dg.AssetSpec(
            self.key,
            deps=[*self.deps, *config],
            description=self.description,
            kinds=set(self.kinds),
            group_name=self.group_name,
            skippable=True,  # a run may have nothing to do for some of its partitions
        )
        if not self.loadable:
            return spec
        # The IO manager finds the stage, under any key prefix, in the definition's metadata.
        return spec.merge_attributes(metadata={STAGE_TAG: self.stage}).with_io_manager_key(
            OUTPUTS_IO_MANAGER_KEY
        )

    def check_specs(self) -> list[dg.AssetCheckSpec]:
        with warnings.catch_warnings():  # partitioned checks are marked preview in 1.13
            warnings.simplefilter("ignore", dg.PreviewWarning)
            return [
                dg.AssetCheckSpec(
                    c.name,
                    asset=self.key,
                    description=c.description,
                    partitions_def=self.partitions_def,
                    blocking=c.blocking,
                )
                for c in self.checks
            ]


def stage_asset(
    *,
    stage: str,
    description: str | None = None,
    deps: Sequence[StageAsset | str | dg.AssetDep] = (),
    required_resource_keys: Sequence[str] = (),
    kinds: set[str] | None = None,
    checks: Sequence[PartitionCheck] = (),
    loadable: bool = False,
    nothing_to_do: NothingToDo | None = None,
) -> Callable[[StageFunction], StageAsset]:
    """Declare a per-item stage function as a partitioned asset that processes batches of items
    (`lane_asset` makes the Dagster asset). Its registry entry (its folder's `STAGE`) gives the
    asset's name, its partition set, its upstream (the asset of the stage it `reads`), its group
    in the UI and, for a model stage, the GPU op tags and the `gpu` pool. `deps`: more upstream
    assets (a StageAsset, an asset name or a `dg.AssetDep`), for a stage that reads beyond its
    registry entry. `loadable`: a downstream asset may take the stage's output as an input, a
    typed value of outputs.py (the stage returns nothing: its files are its output).
    `nothing_to_do`: for a stage that queues work items only for some partitions (a backup where a
    project names one), which of the partitions without an item need no work, and why; a run
    that targets them records them as done (a person's backfill or Materialize of them succeeds)."""
    spec = REGISTRY[stage]
    partitions_def = PARTITIONS[spec.keys]
    upstream = (
        [_dependency(REGISTRY[spec.reads].asset, PARTITIONS[REGISTRY[spec.reads].keys], spec.keys)]
        if spec.reads
        else []
    )
    upstream += [
        _dependency(d.name, d.partitions_def, spec.keys) if isinstance(d, StageAsset) else d
        for d in deps
    ]

    def decorator(process: StageFunction) -> StageAsset:
        return StageAsset(
            name=spec.asset,
            stage=stage,
            process=process,
            partitions_def=partitions_def,
            description=description or (process.__doc__ or "").strip() or None,
            deps=tuple(dg.AssetDep(d) if isinstance(d, str) else d for d in upstream),
            required_resource_keys=frozenset({"db", *required_resource_keys}),
            op_tags=dict(GPU_OP_TAGS) if spec.gpu else {},
            pool=GPU_POOL if spec.gpu else None,
            kinds=frozenset(kinds or ()),
            group_name=spec.group,
            checks=tuple(checks),
            loadable=loadable,
            config_versioned=spec.keys == PROJECTS,
            nothing_to_do=nothing_to_do,
        )

    return decorator


def _dependency(asset: str, upstream: dg.PartitionsDefinition, keys: str) -> dg.AssetDep:
    """The dependency on `asset` of an asset partitioned by `keys`. Within one partition set a
    partition depends on the same partition upstream. Across sets (a project's videos, a video's
    projects) Dagster has no mapping that follows the claim tables' links, and a bare dependency
    would claim the identity (false lineage, backfills refused): each partition is said to depend
    on all of the upstream's, the one true statement Dagster can express (docs/architecture.md,
    "Partitions")."""
    if upstream.name == keys:  # type: ignore[attr-defined]
        return dg.AssetDep(asset)
    return dg.AssetDep(asset, partition_mapping=dg.AllPartitionMapping())
