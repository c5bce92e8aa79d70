"""The claim / heartbeat / complete dance, written once for every stage.

A stage is one function `(item, ctx) -> ItemResult` turned into a dynamically partitioned Dagster
asset by `@stage_asset`. The asset claims the work items behind the partitions of its run (many per
run, so process start-up and model loading are paid once per batch), calls the function for each,
and finishes each item in one transaction: the item is marked done, the function's results are
recorded and its files published, or nothing is. Then it reports the partition's materialization.

Outcomes per item:
* return an ItemResult                -> done, materialized
* raise Blocked("reason")              -> blocked by a rule (terminal, not a failure)
* raise PermanentFailure("reason")     -> dead at once (retrying cannot help)
* raise anything else                  -> failed; retried with back-off, dead after the last attempt
* the lease was lost meanwhile         -> nothing is published; the new owner's work stands

A failing item never stops the others. Failures are logged, recorded on the work item, and reported
on the partition as an observation with the reason; a run of a single partition fails outright so
that `dagster asset materialize --partition X` shows the error.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.core.files import remove
from dataminer_dagster.core.progress import Progress
from dataminer_dagster.db.leases import Lease, LeaseLost, Unclaimed
from dataminer_dagster.resources.database import DatabaseResource
from dataminer_dagster.stages import split_project_video_key

# Run tag set by our sensors: their runs respect retry back-off; a person's run does not wait.
REQUESTED_BY_TAG = "dataminer/requested_by"
STAGE_TAG = "dataminer/stage"


class Blocked(Exception):
    """A rule says skip this item (blocked hashtag, too long...): terminal, and not a failure."""


class PermanentFailure(Exception):
    """Retrying cannot help (HTTP 404, an undecodable file): the item is dead at once."""


@dataclass
class ItemResult:
    metadata: dict[str, Any] = field(default_factory=dict)  # shown on the partition in the UI
    outcome: dict[str, Any] | None = None  # short summary kept on the work item
    commit: Callable[[sa.Connection], None] | None = (
        None  # record + publish, inside the transaction
    )
    staged: list[Path] = field(default_factory=list)  # temporary paths, removed afterwards


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
    """What a stage function may use besides its item: the Dagster context, the database, logs."""

    def __init__(self, context: dg.AssetExecutionContext, db: DatabaseResource):
        self.context = context
        self.db = db
        self.log = context.log
        self._memo: dict[Any, Any] = {}

    @property
    def resources(self) -> Any:
        return self.context.resources

    def memo(self, key: Any, factory: Callable[[], Any]) -> Any:
        """Compute once per run (e.g. text embeddings of a project's prompts)."""
        if key not in self._memo:
            self._memo[key] = factory()
        return self._memo[key]

    def check_lease(self, item: StageItem) -> None:
        """Call between units of long work: raises LeaseLost when the item was taken away."""
        self.db.leases.check(item.lease)


@dataclass(frozen=True)
class StageCheck:
    """An asset check the stage evaluates at the end of each run, over the items it finished
    (`keys`) or over everything it owns; returns a passed flag and metadata."""

    name: str
    description: str
    evaluate: Callable[[StageContext, list[str]], tuple[bool, dict[str, Any]]]


class StageConfig(dg.Config):
    redo: bool = False
    """Process items again even when they are already done, dead or blocked."""


StageFunction = Callable[[StageItem, StageContext], ItemResult]


def stage_asset(
    *,
    stage: str,
    partitions_def: dg.PartitionsDefinition,
    description: str | None = None,
    deps: Sequence[Any] = (),
    required_resource_keys: Sequence[str] = (),
    op_tags: dict[str, Any] | None = None,
    pool: str | None = None,
    kinds: set[str] | None = None,
    group_name: str = "pipeline",
    checks: Sequence[StageCheck] = (),
) -> Callable[[StageFunction], dg.AssetsDefinition]:
    """Turn a per-item stage function into a partitioned asset that processes batches of items."""

    def decorator(process: StageFunction) -> dg.AssetsDefinition:
        with warnings.catch_warnings():  # backfill_policy is marked beta; we rely on single_run
            warnings.simplefilter("ignore", dg.BetaWarning)
            return _build(process)

    def _build(process: StageFunction) -> dg.AssetsDefinition:
        @dg.asset(
            name=process.__name__,
            description=description or (process.__doc__ or "").strip() or None,
            partitions_def=partitions_def,
            backfill_policy=dg.BackfillPolicy.single_run(),
            output_required=False,
            deps=list(deps),
            required_resource_keys={"db", *required_resource_keys},
            op_tags={STAGE_TAG: stage, **(op_tags or {})},
            pool=pool,
            kinds=kinds,
            group_name=group_name,
            check_specs=[
                dg.AssetCheckSpec(c.name, asset=process.__name__, description=c.description)
                for c in checks
            ],
        )
        def asset_fn(context: dg.AssetExecutionContext, config: StageConfig):
            yield from run_stage(context, config, stage, process, checks)

        return asset_fn

    return decorator


def run_stage(
    context: dg.AssetExecutionContext,
    config: StageConfig,
    stage: str,
    process: StageFunction,
    checks: Sequence[StageCheck] = (),
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckResult]:
    db: DatabaseResource = context.resources.db
    keys = list(context.partition_keys)
    by_sensor = context.run.tags.get(REQUESTED_BY_TAG) == "sensor"
    leases, unclaimed = db.leases.claim_keys(
        stage, keys, redo=config.redo, respect_backoff=by_sensor
    )
    _report_unclaimed(context, stage, unclaimed, len(keys))

    ctx = StageContext(context, db)
    progress = Progress(f"{stage}", len(leases), context.log.info)
    failures: list[str] = []
    finished: list[str] = []
    pending = list(leases)
    try:
        while pending:
            lease = pending.pop(0)
            for event in _process_item(context, ctx, process, lease, failures):
                if isinstance(event, dg.AssetMaterialization):
                    finished.append(lease.key)
                yield event
            progress.advance()
    finally:
        db.leases.release_many(pending)  # interrupted: give back what was never started

    selected = {key.name for key in context.selected_asset_check_keys}
    for check in checks:
        if check.name in selected:
            passed, metadata = check.evaluate(ctx, finished)
            yield dg.AssetCheckResult(check_name=check.name, passed=passed, metadata=metadata)

    if failures and len(keys) == 1:
        raise dg.Failure(description=failures[0])
    if failures:
        context.log.warning(
            f"{stage}: {len(failures)} of {len(leases)} items failed; the others are done"
        )


def _process_item(
    context: dg.AssetExecutionContext,
    ctx: StageContext,
    process: StageFunction,
    lease: Lease,
    failures: list[str],
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation]:
    leases = ctx.db.leases
    item = StageItem(lease)
    result: ItemResult | None = None
    try:
        leases.begin(lease)
        result = process(item, ctx)
        with leases.completing(lease, result.outcome) as conn:
            if result.commit is not None:
                result.commit(conn)
        yield dg.AssetMaterialization(
            asset_key=context.asset_key,
            partition=lease.key,
            metadata=_metadata(result.metadata, lease),
        )
    except LeaseLost as lost:
        context.log.warning(str(lost))
    except Blocked as reason:
        leases.block(lease, str(reason))
        context.log.info(f"{lease.stage} {lease.key}: skipped: {reason}")
        yield _observation(context, lease, "blocked", str(reason))
    except Exception as error:  # one bad item must not stop the batch
        permanent = isinstance(error, PermanentFailure)
        message = (
            str(error)
            if isinstance(error, (PermanentFailure, ValueError, OSError))
            else f"{type(error).__name__}: {error}"
        )
        outcome = leases.fail(lease, message, retryable=not permanent)
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
        yield _observation(context, lease, outcome.status or "failed", message)
    finally:
        for path in result.staged if result else ():
            remove(path)


def _metadata(metadata: dict[str, Any], lease: Lease) -> dict[str, Any]:
    return {**metadata, "attempt": lease.attempt}


def _observation(
    context: dg.AssetExecutionContext, lease: Lease, status: str, reason: str
) -> dg.AssetObservation:
    return dg.AssetObservation(
        asset_key=context.asset_key,
        partition=lease.key,
        metadata={"status": status, "reason": reason, "attempt": lease.attempt},
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
