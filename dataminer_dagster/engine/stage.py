"""The claim / heartbeat / complete dance, written once for every stage.

A stage is one function `(item, ctx) -> ItemResult` declared as a dynamically partitioned asset
by `@stage_asset`; the stages of a lane (engine/registry.py) become one Dagster multi-asset, `lane_asset`,
whose step runs each selected stage in turn. A stage claims the work items behind the partitions of
its run (many per run, so process start-up and model loading are paid once per batch), calls the
function for each, and finishes each item in one transaction: the item is marked done, the
function's results are recorded and its files published, or nothing is. Then it reports the
partition's materialization.

Outcomes per item:
* return an ItemResult                -> done, materialized
* raise Blocked("reason")              -> blocked by a rule (terminal, not a failure)
* raise PermanentFailure("reason")     -> dead at once (retrying cannot help)
* raise Postponed("reason")            -> not the item's fault (a paused host): failed, retried
                                          with back-off, the attempt not counted (never dead)
* a full disk, in any stage            -> postponed the same way: an OSError with errno ENOSPC or
                                          EDQUOT anywhere in the exception's chain, or
                                          InsufficientDiskSpace (core/files.py, `disk_full`)
* raise anything else                  -> failed; retried with back-off, dead after the last attempt
* the run's deadline passed meanwhile  -> given back as it was, no attempt used (PastDeadline,
                                          raised by StageContext.check_deadline: a download)
* the lease was lost meanwhile         -> nothing is published; the new owner's work stands

A stage builds its files in staging paths it takes from `ctx.staging_path(final)` and publishes them
in its commit; whatever becomes of the item, the machinery removes those paths once it is over, so
that no failure leaves a half-written output behind to fill the disk.

A run works on its items one after another, or `at_once` of them at a time in threads where the
stage's StageSpec says so (downloads: a slow host does not hold up the rest of the batch); no item
is started once the run's deadline has passed.

A failing item never stops the others. Failures are logged, recorded on the work item, and reported
on the partition as an observation with the reason; a run of a single partition fails outright so
that `dagster asset materialize --partition X` shows the error. A postponement is no failure: its
observation says why, and its log line is said at most once a minute (with a count), since a full
disk postpones every item that meets it.

What the UI shows of an item: its metadata made readable (engine/previews.py: previews as
thumbnails and pictures, floats rounded, paths as paths), the video's title beside a video's
partition key, and the attempt only when it was a retry. A stage's `PartitionCheck`s run at the end
of the run, once for each partition it finished, and are recorded on that partition.
"""

import copy
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import dagster as dg

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.core.files import InsufficientDiskSpace, disk_full, remove, staging_path
from dataminer_dagster.core.progress import Progress, RepeatedLines
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import Lease, LeaseLost, Unclaimed
from dataminer_dagster.db.project_flow import advance_projects, stale_later_stages
from dataminer_dagster.db.project_records import stage_fingerprint
from dataminer_dagster.db.schema import DEAD, DONE
from dataminer_dagster.engine.checks import PartitionCheck, evaluate_checks
from dataminer_dagster.engine.config_versions import provenance_tags
from dataminer_dagster.engine.jobs import name_prefix
from dataminer_dagster.engine.outcomes import (
    Blocked,
    ItemResult,
    PastDeadline,
    PermanentFailure,
    Postponed,
    RequeueFirst,
)
from dataminer_dagster.engine.partitions import PARTITIONS
from dataminer_dagster.engine.previews import ui_metadata
from dataminer_dagster.engine.registry import PROJECTS, split_project_video_key
from dataminer_dagster.outputs import OUTPUTS_IO_MANAGER_KEY
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import DownloadClient
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.resources.stage_outputs import stage_outputs_io_manager
from dataminer_dagster.tags import (
    BACKFILL_TAG,
    DEADLINE_TAG,
    GPU_OP_TAGS,
    GPU_POOL,
    LANE_TAG,
    PROJECTS_TAG,
    REQUESTED_BY_TAG,
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
        over, whatever became of it: the item's commit publishes it (`publish`) before that."""
        staged = staging_path(final)
        self._staged.append(staged)
        return staged

    def for_item(self) -> "StageContext":
        """This context for the work on one item: the run's memo, the item's own staging."""
        item_context = copy.copy(self)
        item_context._staged = []
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


class _VideoTitles:
    """What names an item for a person: the video's title beside a video's partition key. The
    titles of a run's videos are read once, when the run has claimed them; a video without one
    yet (its download is this very item) is read again when asked."""

    def __init__(self, catalog: Catalog, leases: Sequence[Lease]):
        self._catalog = catalog
        self._titles: dict[str, str] = {}
        self._read([lease.video_id for lease in leases if lease.video_id is not None])

    def _read(self, video_ids: list[str]) -> None:
        if video_ids:
            videos = self._catalog.videos(video_ids).values()
            self._titles.update((v.video_id, v.title) for v in videos if v.title)

    def about(self, lease: Lease) -> dict[str, Any]:
        if lease.video_id is None:
            return {}
        if lease.video_id not in self._titles:
            self._read([lease.video_id])
        title = self._titles.get(lease.video_id)
        return {"video_title": title} if title else {}


def run_stage(
    context: dg.AssetExecutionContext,
    config: StageConfig,
    stage_def: StageAsset,
    following: Sequence[str] = (),
    dead: list[str] | None = None,
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckResult]:
    """Run one stage over the run's partitions: claim their items, process each, and tell Dagster
    what became of every partition. Done now or earlier: a materialization (an earlier one is
    recorded as current, so that a backfill or a re-execution counts it). Dead: named in `dead`,
    for the lane to fail the run once all its stages ran (the partition shows failed). A run a
    person launched to retry (`_launched_to_retry`) gives dead items fresh attempts, as
    `dataminer retry` does."""
    stage, process = stage_def.stage, stage_def.process
    dead = [] if dead is None else dead
    db: DatabaseResource = context.resources.db
    keys = list(context.partition_keys)
    tags = context.run.tags
    by_sensor = tags.get(REQUESTED_BY_TAG) == "sensor"
    only = [int(p) for p in tags[PROJECTS_TAG].split(",")] if PROJECTS_TAG in tags else None
    leases, unclaimed = db.leases.claim_keys(
        stage,
        keys,
        redo=config.redo,
        revive_dead=not by_sensor and _launched_to_retry(context.run, keys),
        respect_backoff=by_sensor,
        projects=only,
    )
    _report_unclaimed(context, stage, unclaimed, len(keys))
    current = [earlier for earlier in unclaimed if earlier.status == DONE]
    for earlier in current:
        yield _current(stage_def, context, earlier)
    deadline = float(tags[DEADLINE_TAG]) if DEADLINE_TAG in tags else None

    ctx = StageContext(context, db, following, deadline)
    titles = _VideoTitles(ctx.catalog, leases)
    progress = Progress(f"{stage}", len(leases), context.log.info)
    failures: list[str] = []
    finished: list[str] = [earlier.key for earlier in current]
    pending = list(leases)

    def work(lease: Lease) -> list[dg.AssetMaterialization | dg.AssetObservation]:
        return list(_process_item(context, stage_def, ctx, process, lease, titles, failures, dead))

    try:
        at_once = REGISTRY[stage].at_once
        for lease, events in _work_through(pending, at_once, ctx.past_deadline, work):
            for event in events:
                if isinstance(event, dg.AssetMaterialization):
                    finished.append(lease.key)
                yield event
            progress.advance()
        if pending:
            context.log.warning(
                f"{stage}: past the deadline of the command that asked for this run; "
                f"{len(pending)} items left for later"
            )
    finally:
        db.leases.release_many(pending)  # interrupted: give back what was never started

    yield from evaluate_checks(context, ctx, stage_def, finished)

    # The project that this run's items finished moves on now, not at the sensor's next tick.
    for t in advance_projects(db.store):
        context.log.info(f"project {t.project}: {t.old} -> {t.new} ({t.reason})")

    if failures and len(keys) == 1:
        raise dg.Failure(description=failures[0])
    if failures:
        context.log.warning(
            f"{stage}: {len(failures)} of {len(leases)} items failed; the others are done"
        )


def _work_through(
    pending: list[Lease],
    at_once: int,
    past_deadline: Callable[[], bool],
    work: Callable[[Lease], list[Any]],
) -> Iterator[tuple[Lease, list[Any]]]:
    """Work on the leases of `pending`, `at_once` at a time, taking each off the list as it starts
    (none once past the deadline), and yield each with its events as it ends."""
    if at_once == 1:  # in this thread, as a model stage wants
        while pending and not past_deadline():
            lease = pending.pop(0)
            yield lease, work(lease)
        return
    with ThreadPoolExecutor(at_once, thread_name_prefix="stage-item") as pool:
        running: dict[Future, Lease] = {}
        while True:
            while pending and len(running) < at_once and not past_deadline():
                lease = pending.pop(0)
                running[pool.submit(work, lease)] = lease
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                yield running.pop(future), future.result()


def _process_item(
    context: dg.AssetExecutionContext,
    stage_def: StageAsset,
    ctx: StageContext,
    process: StageFunction,
    lease: Lease,
    titles: _VideoTitles,
    failures: list[str],
    dead: list[str],
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
    asset_key = stage_def.key
    leases = ctx.db.leases
    item = StageItem(lease)
    ctx = ctx.for_item()
    result: ItemResult | None = None
    try:
        leases.begin(lease)
        result = process(item, ctx)
        shown, description = ui_metadata(result.metadata)  # before the commit: it may fail
        elsewhere = {name: ui_metadata(m)[0] for name, m in result.observed.items()}
        with leases.completing(lease, result.outcome) as conn:
            if result.commit is not None:
                result.commit(conn)
            if lease.project_id is not None:
                stale_later_stages(conn, lease.project_id, lease.stage)
        about = titles.about(lease)  # after it: a download has just recorded the title
        yield dg.AssetMaterialization(
            asset_key=asset_key,
            partition=lease.key,
            description=description,
            metadata={**about, **shown, **_attempt(lease), **_config_version(lease)},
            tags=stage_def.provenance(context, lease.key, lease.fingerprint),
        )
        for name, metadata in elsewhere.items():
            yield dg.AssetObservation(
                asset_key=dg.AssetKey([*asset_key.path[:-1], name]),  # under the same prefix
                partition=lease.key,
                metadata={**about, **metadata},
            )
    except LeaseLost as lost:
        context.log.warning(str(lost))
    except PastDeadline as past:
        leases.release_many([lease])
        context.log.warning(
            f"{lease.stage} {lease.key}: {past}; given back for a later run (no attempt used)"
        )
    except Blocked as blocked:
        reason = redact(str(blocked))
        leases.block(lease, reason)
        context.log.info(f"{lease.stage} {lease.key}: skipped: {reason}")
        yield _observation(titles, asset_key, lease, "blocked", reason)
    except Postponed as postponed:
        yield from _postpone(
            context, asset_key, ctx, lease, titles, str(postponed), postponed.not_before
        )
    except Exception as error:  # one bad item must not stop the batch
        if (full := disk_full(error)) is not None:  # the disk's fault, whichever stage met it
            reason = (
                str(full)
                if isinstance(full, InsufficientDiskSpace)
                else f"the disk is full: {full}"
            )
            yield from _postpone(context, asset_key, ctx, lease, titles, reason, topic=_DISK_FULL)
            return
        permanent = isinstance(error, PermanentFailure)
        message = redact(  # what the log, the run's failure and last_error show
            str(error)
            if isinstance(error, (PermanentFailure, RequeueFirst, ValueError, OSError))
            else f"{type(error).__name__}: {error}"
        )
        requeue = error.requeue if isinstance(error, RequeueFirst) else None
        outcome = leases.fail(lease, message, retryable=not permanent, then=requeue)
        if not outcome.applied:
            context.log.warning(
                f"{lease.stage} {lease.key}: failed after its lease was lost: {message}"
            )
            return
        when = (
            f"retry {lease.attempt + 1}/{lease.max_attempts} after {outcome.next_attempt_at:%H:%M:%S %Z}"
            if outcome.status == "failed"
            else "dead: it will not be retried (`dataminer retry` queues it again)"
        )
        text = f"{lease.stage} {lease.key} failed on attempt {lease.attempt}: {message}; {when}"
        context.log.error(text)
        failures.append(text)
        if outcome.status == DEAD:
            dead.append(f"{lease.stage} {lease.key}: {message}")
        yield _observation(titles, asset_key, lease, outcome.status or "failed", message)
    finally:  # whatever became of the item: no staging is left to fill the disk
        for path in [*ctx.staged, *(result.staged if result else ())]:
            remove(path)


# A postponement is said at most once a minute for each topic: a full disk (any stage) or a
# stage's other waits (a paused host). One per process, so that the runs `dataminer run`
# executes one after another say it once a minute too, each partition's observation saying
# the rest.
_POSTPONED_LINES = RepeatedLines(every_s=60.0)
_DISK_FULL = "the disk is full"


def _postpone(
    context: dg.AssetExecutionContext,
    asset_key: dg.AssetKey,
    ctx: StageContext,
    lease: Lease,
    titles: _VideoTitles,
    reason: str,
    not_before: datetime | None = None,
    topic: str | None = None,
) -> Iterator[dg.AssetObservation]:
    """Not the item's fault: it waits without using an attempt, and it is not a failure of the
    run (a one-partition run that meets it succeeds, its observation saying why)."""
    reason = redact(reason)
    outcome = ctx.db.leases.postpone(lease, reason, not_before=not_before)
    if not outcome.applied:
        return
    line = _POSTPONED_LINES.line(
        topic or lease.stage,
        f"{lease.stage} {lease.key} postponed (not counted as an attempt): {reason}; "
        f"tried again after {outcome.next_attempt_at:%H:%M:%S %Z}",
    )
    if line is not None:
        context.log.warning(line)
    yield _observation(titles, asset_key, lease, "postponed", reason)


def _launched_to_retry(run: dg.DagsterRun, keys: Sequence[str]) -> bool:
    """Whether a person launched this run for its partitions whatever became of them: a backfill
    (the UI's, "materialize failed partitions" included), a re-execution, or one partition
    (the UI's Materialize, `dagster asset materialize --partition`). Its dead items get fresh
    attempts (the sensors' runs never ask); other range runs leave them dead."""
    return BACKFILL_TAG in run.tags or run.parent_run_id is not None or len(keys) == 1


def _current(
    stage_def: StageAsset, context: dg.AssetExecutionContext, earlier: Unclaimed
) -> dg.AssetMaterialization:
    """A partition whose item an earlier run finished, recorded as current by this run."""
    when = f"{earlier.finished_at:%Y-%m-%d %H:%M:%S %Z}" if earlier.finished_at else "earlier"
    shown, _ = ui_metadata({"outcome": f"current: done by an earlier run ({when})"})
    summary = {k: v for k, v in (earlier.outcome or {}).items() if isinstance(v, int | float | str)}
    return dg.AssetMaterialization(
        asset_key=stage_def.key,
        partition=earlier.key,
        metadata={**shown, **summary},
        tags=stage_def.provenance(context, earlier.key, earlier.fingerprint),
    )


def _config_version(lease: Lease) -> dict[str, str]:
    """The fingerprint of the project's config the work was done with (ProjectConfig.fingerprints):
    partitions done with different configs show different values."""
    return {"config_version": lease.fingerprint} if lease.fingerprint else {}


def _attempt(lease: Lease) -> dict[str, int]:
    """The attempt, where it says something: a retry."""
    return {"attempt": lease.attempt} if lease.attempt > 1 else {}


def _observation(
    titles: _VideoTitles, asset_key: dg.AssetKey, lease: Lease, outcome: str, reason: str
) -> dg.AssetObservation:
    about = {**titles.about(lease), "outcome": outcome, "reason": reason}
    return dg.AssetObservation(
        asset_key=asset_key,
        partition=lease.key,
        metadata={**ui_metadata(about)[0], **_attempt(lease)},
    )


def _report_unclaimed(
    context: dg.AssetExecutionContext, stage: str, unclaimed: list[Unclaimed], total: int
) -> None:
    if not unclaimed:
        return
    running = [u for u in unclaimed if u.status == "running"]
    for u in running:
        context.log.info(f"{stage} {u.describe()}; this run leaves it alone")
    others = [u for u in unclaimed if u.status != "running"]
    if others:
        shown = "; ".join(u.describe() for u in others[:5])
        more = f" (and {len(others) - 5} more)" if len(others) > 5 else ""
        context.log.info(
            f"{stage}: {len(others)} of {total} partitions need no work now: {shown}{more}"
        )
