"""Running a stage: the claim, heartbeat and complete steps, written once for every stage.

A stage claims the work items behind the partitions of its run (many per run, so process start-up and model loading are paid once per batch), calls the
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
* the database went away mid-item      -> postponed the same way (db/outages.py `outage_reason`:
  (a restart, a cut, its disk full)       the run waited for it to come back before it says so)
* raise anything else                  -> failed; retried with back-off, dead after the last attempt
* the run's deadline passed meanwhile  -> given back as it was, no attempt used (PastDeadline,
                                          raised by StageContext.check_deadline: a download)
* the lease was lost meanwhile         -> nothing is published; the new owner's work stands
  (or the run's heartbeats stopped     (LeaseFenced, db/run_leases.py)
  getting through for too long)

A stage builds its files in staging paths it takes from `ctx.staging_path(final)` and publishes them
in its commit (its previews are published there by the machinery); whatever becomes of the item,
the machinery removes those paths once it is over, so that no failure leaves a half-written
output behind to fill the disk. Every file change is tied to the item's lease: staging names carry
its token, a leftover is removed only once its token's lease is dead (never a live holder's), and
a publish happens only in the completion, whose first statement checks the token and holds the
item's row until COMMIT (engine/stage.py, core/files.py, db/file_changes.py).

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

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from typing import Any

import dagster as dg
import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.core.bounded_text import cut
from dataminer_dagster.core.files import InsufficientDiskSpace, disk_full, remove
from dataminer_dagster.core.progress import Progress, RepeatedLines
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.file_changes import file_changes, forget_staged
from dataminer_dagster.db.leases import Lease, LeaseLost, Unclaimed
from dataminer_dagster.db.outages import DatabaseUnreachable, outage_reason
from dataminer_dagster.db.project_flow import advance_projects, stale_later_stages
from dataminer_dagster.db.schema import DEAD, DONE
from dataminer_dagster.engine.checks import evaluate_checks
from dataminer_dagster.engine.jobs import name_prefix
from dataminer_dagster.engine.outcomes import (
    Blocked,
    PastDeadline,
    PermanentFailure,
    Postponed,
    RequeueFirst,
)
from dataminer_dagster.engine.previews import previews, ui_metadata
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import StageAsset, StageConfig, StageFunction
from dataminer_dagster.outputs import OUTPUTS_IO_MANAGER_KEY
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.stage_outputs import stage_outputs_io_manager
from dataminer_dagster.tags import (
    AUTOMATIONS,
    BACKFILL_TAG,
    DEADLINE_TAG,
    LANE_TAG,
    PROJECTS_TAG,
    REQUESTED_BY_TAG,
)


class _VideoTitles:
    """What names an item for a person: the video's title beside a video's partition key. The
    titles of a run's videos are read once, when the run has claimed them; a video without one
    yet (its download is this very item) is read again when asked."""

    def __init__(self, catalog: Catalog, video_ids: Sequence[str | None]):
        self._catalog = catalog
        self._titles: dict[str, str] = {}
        self._read(sorted({v for v in video_ids if v is not None}))

    def _read(self, video_ids: list[str]) -> None:
        if video_ids:
            videos = self._catalog.videos.get(video_ids).values()
            self._titles.update((v.video_id, v.title) for v in videos if v.title)

    def about(self, item: Lease | Unclaimed) -> dict[str, Any]:
        if item.video_id is None:
            return {}
        if item.video_id not in self._titles:
            self._read([item.video_id])
        title = self._titles.get(item.video_id)
        return {"video_title": title} if title else {}


def run_stage(
    context: dg.AssetExecutionContext,
    config: StageConfig,
    stage_def: StageAsset,
    following: Sequence[str] = (),
    dead: list[str] | None = None,
) -> Iterator[dg.AssetMaterialization | dg.AssetObservation | dg.AssetCheckResult | dg.Output]:
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
    automatic = tags.get(REQUESTED_BY_TAG) in AUTOMATIONS
    only = [int(p) for p in tags[PROJECTS_TAG].split(",")] if PROJECTS_TAG in tags else None
    leases, unclaimed = db.leases.claim_keys(
        stage,
        keys,
        redo=config.redo,
        revive_dead=not automatic and _launched_to_retry(context.run, keys),
        respect_backoff=automatic,
        projects=only,
    )
    deadline = float(tags[DEADLINE_TAG]) if DEADLINE_TAG in tags else None
    ctx = StageContext(context, db, following, deadline)
    idle = _nothing_to_do(stage_def, ctx, unclaimed)
    _report_unclaimed(context, stage, [u for u in unclaimed if u.key not in idle], len(keys))
    current = [earlier for earlier in unclaimed if earlier.status == DONE]
    titles = _VideoTitles(ctx.catalog, [i.video_id for i in [*leases, *current]])
    for earlier in current:
        yield _current(stage_def, context, earlier, titles)
    for key, metadata in idle.items():
        shown, description = ui_metadata(metadata)
        yield dg.AssetMaterialization(
            asset_key=stage_def.key, partition=key, description=description, metadata=shown
        )

    progress = Progress(f"{stage}", len(leases), context.log.info)
    failures: list[str] = []
    finished: list[str] = [earlier.key for earlier in current] + list(idle)
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
    ctx = ctx.for_item(lease)
    completed = False
    try:
        leases.begin(lease)
        result = process(item, ctx)
        shown, description = ui_metadata(result.metadata)  # before the commit: it may fail
        elsewhere = {name: ui_metadata(m)[0] for name, m in result.observed.items()}
        with leases.completing(lease, result.outcome) as conn:
            if result.commit is not None:
                result.commit(conn)
            for preview in previews(result.metadata):
                file_changes(conn).publish(preview.staged, preview.file)
            if lease.project_id is not None:
                stale_later_stages(conn, lease.project_id, lease.stage)
            if ctx.staged:  # published, or removed below
                forget_staged(conn, lease.token.hex)
        completed = True
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
        reason = cut(redact(str(blocked)), ERROR_CHARS)
        leases.block(lease, reason)
        context.log.info(f"{lease.stage} {lease.key}: skipped: {reason}")
        yield _observation(titles, asset_key, lease, "blocked", reason)
    except Postponed as postponed:
        yield from _postpone(
            context, asset_key, ctx, lease, titles, str(postponed), postponed.not_before
        )
    except Exception as error:  # one bad item must not stop the batch
        if (away := outage_reason(error)) is not None:  # the database's fault, not the item's
            reason = f"the database could not be used: {away}"
            yield from _postpone(context, asset_key, ctx, lease, titles, reason, topic=_DB_AWAY)
            return
        if (full := disk_full(error)) is not None:  # the disk's fault, whichever stage met it
            reason = (
                str(full)
                if isinstance(full, InsufficientDiskSpace)
                else f"the disk is full: {full}"
            )
            yield from _postpone(context, asset_key, ctx, lease, titles, reason, topic=_DISK_FULL)
            return
        permanent = isinstance(error, PermanentFailure)
        message = cut(  # what the log, the run's failure and last_error show
            redact(
                str(error)
                if isinstance(error, (PermanentFailure, RequeueFirst, ValueError, OSError))
                else f"{type(error).__name__}: {error}"
            ),
            ERROR_CHARS,
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
        for path in ctx.staged:
            remove(path)
        if ctx.staged and not completed:
            # Else the lease reaper looks for leftovers of the lease once it is dead.
            with contextlib.suppress(sa.exc.SQLAlchemyError, DatabaseUnreachable):
                leases.forget_staged(lease)


# The most of an item's error kept (last_error) and logged: a pasted file in a URL is not copied
# into every log line and row that names the error.
ERROR_CHARS = 2000

# A postponement is said at most once a minute for each topic: a full disk (any stage) or a
# stage's other waits (a paused host). One per process, so that the runs `dataminer run`
# executes one after another say it once a minute too, each partition's observation saying
# the rest.
_POSTPONED_LINES = RepeatedLines(every_s=60.0)
_DISK_FULL = "the disk is full"
_DB_AWAY = "the database could not be used"


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
    reason = cut(redact(reason), ERROR_CHARS)
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


def _nothing_to_do(
    stage_def: StageAsset, ctx: StageContext, unclaimed: list[Unclaimed]
) -> dict[str, Mapping[str, Any]]:
    """The partitions without a work item that the stage has nothing to do for, with why (its
    `nothing_to_do`): recorded as done, since there is no work that could make them so."""
    without_item = [u.key for u in unclaimed if u.status is None]
    if stage_def.nothing_to_do is None or not without_item:
        return {}
    idle = dict(stage_def.nothing_to_do(ctx, without_item))
    if idle:
        ctx.log.info(
            f"{stage_def.stage}: {len(idle)} partitions have nothing to do; recorded as done"
        )
    return idle


def _current(
    stage_def: StageAsset,
    context: dg.AssetExecutionContext,
    earlier: Unclaimed,
    titles: _VideoTitles,
) -> dg.AssetMaterialization:
    """A partition whose item an earlier run finished, recorded as current by this run."""
    when = f"{earlier.finished_at:%Y-%m-%d %H:%M:%S %Z}" if earlier.finished_at else "earlier"
    about = {**titles.about(earlier), "outcome": f"current: done by an earlier run ({when})"}
    shown, _ = ui_metadata(about)
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


def lane_asset(
    name: str, stages: Sequence[StageAsset], backfill_policy: dg.BackfillPolicy | None = None
) -> dg.AssetsDefinition:
    """The stages of a lane (one partition set, in order) as one multi-asset: one step that runs
    each selected stage over the run's partitions in turn. It takes the `gpu` pool slot for the
    whole step when one of its stages needs it. A lane with loadable stages carries their IO
    manager (on the `db` resource), so that a code location's resources need not name it.
    `backfill_policy`: how a backfill groups its partitions into runs (default: one run)."""
    partitions = {s.partitions_def for s in stages}
    pools = {s.pool for s in stages} - {None}
    if len(partitions) != 1 or len(pools) > 1:
        raise ValueError(f"lane {name}: its stages must share one partition set and one pool")
    op_tags: dict[str, Any] = {}
    for s in stages:
        op_tags.update(s.op_tags)

    with warnings.catch_warnings():  # backfill_policy is marked beta
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.multi_asset(
            name=f"{name_prefix(stages)}{name}_lane",
            specs=[s.spec() for s in stages],
            check_specs=[c for s in stages for c in s.check_specs()],
            partitions_def=partitions.pop(),
            backfill_policy=backfill_policy or dg.BackfillPolicy.single_run(),
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
