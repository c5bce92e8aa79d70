"""What a stage's asset checks are: a `PartitionCheck`, evaluated per partition at the end of a
run (engine/checks.py), and the `CheckResult` it gives each partition."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import dagster as dg

from dataminer_dagster.engine.stage import StageContext


@dataclass(frozen=True)
class CheckResult:
    """One partition's check result: flat numbers that the UI plots (`missing_files: 0`), and
    on failure a description that says what is wrong in words."""

    passed: bool
    metadata: dict[str, int | float] = field(default_factory=dict)
    description: str | None = None


@dataclass(frozen=True)
class PartitionCheck:
    """An asset check evaluated for each partition a run finished, at the end of the run: its
    result is recorded on that partition (the Checks tab's Partition column). `severity`: how a
    failure shows (ERROR red, WARN yellow). `blocking`: a failure of severity ERROR fails the
    step once it has recorded everything (Dagster's blocking checks), so the run fails, the
    partitions it materialized show failed, and no later step of the run starts."""

    name: str
    description: str
    evaluate: Callable[[StageContext, str], CheckResult]
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR
    blocking: bool = False
