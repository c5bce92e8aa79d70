"""Declaring a stage: one function `(item, ctx) -> ItemResult` declared as a dynamically
partitioned asset by `@stage_asset` (`StageAsset`: its spec, its checks, its config asset); the
stages of a lane (engine/registry.py) become one Dagster multi-asset, `lane_asset`, whose step runs
each selected stage in turn (engine/stage_run.py). What a stage's function gets: its item
(`StageItem`) and `StageContext` (the database, the models and download client, staging paths,
the run's deadline)."""

import copy
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.core.files import staging_path
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import Lease
from dataminer_dagster.db.project_records import stage_fingerprint
from dataminer_dagster.engine.checks import PartitionCheck
from dataminer_dagster.engine.config_versions import provenance_tags
from dataminer_dagster.engine.jobs import name_prefix
from dataminer_dagster.engine.outcomes import (
    ItemResult,
    PastDeadline,
)
from dataminer_dagster.engine.partitions import PARTITIONS
from dataminer_dagster.engine.registry import PROJECTS, split_project_video_key
from dataminer_dagster.outputs import OUTPUTS_IO_MANAGER_KEY
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import DownloadClient
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.resources.stage_outputs import stage_outputs_io_manager
from dataminer_dagster.tags import (
    GPU_OP_TAGS,
    GPU_POOL,
    LANE_TAG,
    STAGE_TAG,
)


@dataclass(frozen=True)
class StageItem:
    lease: Lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def video_id(self) -> str:
        if self.lease.video_id is None:
            raise ValueError(f"{self.lease.stage} item {self.key} is not about one video")
        return self.lease.video_id

    @property
    def project(self) -> str:
        """Project name, for project and project-video stages."""
        return split_project_video_key(self.key)[0] if "." in self.key else self.key


class StageContext:
    """What a stage function may use besides its item: the Dagster context, the database, logs,
    and the staging paths it builds its outputs in (`staging_path`).

    `following`: the stages this run executes after this one (its lane's). Items the stage queues
    for them are marked requested (`catalog`), so that no other run is asked for them meanwhile
    and a run requested ahead of them keeps waiting."""

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        db: DatabaseResource,
        following: Sequence[str] = (),
        deadline: float | None = None,
    ):
        self.context = context
        self.db = db
        self.log = context.log
        self.following = frozenset(following)
        # When the command that asked for this run stops waiting for it (time.time()).
        self.deadline = deadline
        self._memo: dict[Any, Any] = {}
        self._staged: list[Path] = []
        self._lease: Lease | None = None  # the item's (`for_item`)

    @property
    def catalog(self) -> Catalog:
        return self.db.catalog_for(requested_stages=self.following)

    @property
    def download_client(self) -> DownloadClient:
        """The `download_client` resource (stages that declare it in required_resource_keys)."""
        client = self.context.resources.download_client
        if not isinstance(client, DownloadClient):
            raise TypeError(f"resource download_client is a {type(client).__name__}")
        return client

    @property
    def models(self) -> ModelsResource:
        """The `models` resource (stages that declare it in required_resource_keys)."""
        models = self.context.resources.models
        if not isinstance(models, ModelsResource):
            raise TypeError(f"resource models is a {type(models).__name__}")
        return models

    def staging_path(self, final: Path) -> Path:
        """A fresh hidden sibling of `final` to build it in (what an earlier attempt killed
        mid-way left there is removed first). The stage machinery removes it once the item is
        over, whatever became of it: the item's commit publishes it (`publish`) before that.
        Raises LeaseLost (or LeaseFenced) first when the item's lease is no longer surely held."""
        if self._lease is not None:
            self.db.leases.check(self._lease)
        staged = staging_path(final)
        self._staged.append(staged)
        return staged

    def for_item(self, lease: Lease) -> "StageContext":
        """This context for the work on one item: the run's memo, the item's own staging."""
        item_context = copy.copy(self)
        item_context._staged = []
        item_context._lease = lease
        return item_context

    @property
    def staged(self) -> list[Path]:
        """The staging paths handed out by `staging_path` (of the item's context)."""
        return list(self._staged)

    def memo(self, key: Any, factory: Callable[[], Any]) -> Any:
        """Compute once per run (e.g. text embeddings of a project's prompts)."""
        if key not in self._memo:
            self._memo[key] = factory()
        return self._memo[key]

    def check_lease(self, item: StageItem) -> None:
        """Call between units of long work: raises LeaseLost when the item was taken away."""
        self.db.leases.check(item.lease)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    def check_deadline(self) -> None:
        """Call while waiting on something slow (a download): raises PastDeadline once the
        command that asked for this run stopped waiting (`dataminer run --timeout`), so that the
        item is given back rather than finished long after."""
        if self.past_deadline():
            raise PastDeadline("past the deadline of the command that asked for this run")


class StageConfig(dg.Config):
    redo: bool = False
    """Process items again even when they are already done, dead or blocked."""


StageFunction = Callable[[StageItem, StageContext], ItemResult]


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
) -> Callable[[StageFunction], StageAsset]:
    """Declare a per-item stage function as a partitioned asset that processes batches of items
    (`lane_asset` makes the Dagster asset). Its registry entry (its folder's `STAGE`) gives the
    asset's name, its partition set, its upstream (the asset of the stage it `reads`), its group
    in the UI and, for a model stage, the GPU op tags and the `gpu` pool. `deps`: more upstream
    assets (a StageAsset, an asset name or a `dg.AssetDep`), for a stage that reads beyond its
    registry entry. `loadable`: a downstream asset may take the stage's output as an input, a
    typed value of outputs.py (the stage returns nothing: its files are its output)."""
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


def lane_asset(name: str, stages: Sequence[StageAsset]) -> dg.AssetsDefinition:
    """The stages of a lane (one partition set, in order) as one multi-asset: one step that runs
    each selected stage over the run's partitions in turn. It takes the `gpu` pool slot for the
    whole step when one of its stages needs it. A lane with loadable stages carries their IO
    manager (on the `db` resource), so that a code location's resources need not name it."""
    partitions = {s.partitions_def for s in stages}
    pools = {s.pool for s in stages} - {None}
    if len(partitions) != 1 or len(pools) > 1:
        raise ValueError(f"lane {name}: its stages must share one partition set and one pool")
    op_tags: dict[str, Any] = {}
    for s in stages:
        op_tags.update(s.op_tags)

    with warnings.catch_warnings():  # backfill_policy is marked beta; we rely on single_run
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.multi_asset(
            name=f"{name_prefix(stages)}{name}_lane",
            specs=[s.spec() for s in stages],
            check_specs=[c for s in stages for c in s.check_specs()],
            partitions_def=partitions.pop(),
            backfill_policy=dg.BackfillPolicy.single_run(),
            can_subset=True,
            required_resource_keys=set().union(*(s.required_resource_keys for s in stages)),
            op_tags={LANE_TAG: name, **op_tags},
            pool=pools.pop() if pools else None,
            resource_defs=(
                {OUTPUTS_IO_MANAGER_KEY: stage_outputs_io_manager}
                if any(s.loadable for s in stages)
                else None
            ),
        )
        def lane_fn(context: dg.AssetExecutionContext, config: StageConfig):
            from dataminer_dagster.engine.stage_run import run_stage  # it imports this module

            selected = [s for s in stages if s.key in context.selected_asset_keys]
            dead: list[str] = []
            for position, stage in enumerate(selected):
                following = [s.stage for s in selected[position + 1 :]]
                yield from run_stage(context, config, stage, following, dead)
            if dead:  # after every stage of the lane: the batch's good items went on
                raise dg.Failure(
                    description=f"{len(dead)} items are dead: "
                    + "; ".join(dead[:5])
                    + (f" (and {len(dead) - 5} more)" if len(dead) > 5 else ""),
                    metadata={"dead_items": len(dead)},
                )

    return lane_fn
