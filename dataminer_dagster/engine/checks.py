"""A stage's asset checks, evaluated per partition: each check runs at the end of a run, once for
each partition the run finished, and its result is recorded on that partition (the Checks tab's
Partition column) against that partition's latest materialization."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData as TargetMaterialization,
)

from dataminer_dagster.core.redact import redact
from dataminer_dagster.engine.partition_checks import CheckResult, PartitionCheck
from dataminer_dagster.engine.previews import readable
from dataminer_dagster.engine.stage import StageContext
from dataminer_dagster.engine.stage_asset import StageAsset


def evaluate_checks(
    context: dg.AssetExecutionContext,
    ctx: StageContext,
    stage_def: StageAsset,
    finished: list[str],
) -> Iterator[dg.AssetCheckEvaluation | dg.AssetCheckResult | dg.Output]:
    """The stage's selected checks, once per partition this run finished or recorded as current.
    A run of one partition yields AssetCheckResults, which Dagster counts as the run's check
    outputs. A range run has no single partition key, so each result is an AssetCheckEvaluation
    naming its partition and the materialization it checked. Dagster 1.13 counts only
    AssetCheckResults and Outputs as a check's output, and logs that the op "did not yield or
    return expected outputs" for a selected check without one, which reads as a failure. So a
    check that yielded no AssetCheckResult yields its output as a plain Output (what Dagster
    yields beside an AssetCheckResult): it says the check went over every partition this run
    finished, none included. Whether each passed is in its evaluation, and a failed blocking check
    still fails the step."""
    key = stage_def.key
    selected = {c.name for c in context.selected_asset_check_keys if c.asset_key == key}
    checks = [c for c in stage_def.checks if c.name in selected]
    targets = _latest_materializations(context.instance, key, finished) if finished else {}
    single = context.partition_key if context.has_partition_key else None
    for check in checks:
        for partition in finished:
            result = _evaluate_partition(ctx, check, partition)
            if partition == single:  # Dagster counts it as the check's output of this run
                yield dg.AssetCheckResult(  # blocking comes from the check's spec
                    asset_key=key,
                    check_name=check.name,
                    passed=result.passed,
                    metadata={k: readable(v) for k, v in result.metadata.items()},
                    description=result.description,
                    severity=check.severity,
                )
                continue
            yield dg.AssetCheckEvaluation(
                asset_key=key,
                check_name=check.name,
                passed=result.passed,
                metadata={k: readable(v) for k, v in result.metadata.items()},
                description=result.description,
                target_materialization_data=targets.get(partition),
                partition=partition,
                severity=check.severity,
                blocking=check.blocking,
            )
        if single not in finished:
            yield dg.Output(None, output_name=_output_name(context, key, check))


def _output_name(context: dg.AssetExecutionContext, key: dg.AssetKey, check: PartitionCheck) -> str:
    """The name of the step output that stands for `check` of the asset `key`."""
    return context.assets_def.get_output_name_for_asset_check_key(dg.AssetCheckKey(key, check.name))


def _evaluate_partition(ctx: StageContext, check: PartitionCheck, partition: str) -> CheckResult:
    try:
        result = check.evaluate(ctx, partition)
    except Exception as error:  # a check that cannot run is a failed check, not a failed run
        message = redact(f"{type(error).__name__}: {error}")
        ctx.log.error(f"check {check.name} of {partition} could not run: {message}")
        return CheckResult(False, {}, f"The check could not run: {message}")
    if result.passed or result.description:
        return result
    summary = ", ".join(f"{k} {v}" for k, v in result.metadata.items())
    return CheckResult(False, result.metadata, f"{check.description} Not so: {summary}.")


def _latest_materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, partitions: list[str]
) -> dict[str, TargetMaterialization]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=len(partitions)
    ).records
    latest: dict[str, TargetMaterialization] = {}
    for record in records:  # newest first
        partition = record.partition_key
        if partition is not None and partition not in latest:
            latest[partition] = TargetMaterialization(
                storage_id=record.storage_id,
                run_id=record.run_id,
                timestamp=record.timestamp,
            )
    return latest
