"""The lanes' jobs: one Dagster job per lane whose every stage is declared, for the Definitions,
the sensors and `dataminer run` alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from dataminer_dagster.lanes import Lane
from dataminer_dagster.tags import LANE_TAG

if TYPE_CHECKING:  # the sensors use this module; they must not import the stage machinery
    from dataminer_dagster.engine.stage_asset import StageAsset


def lanes_of(stages: Mapping[str, StageAsset], lanes: Sequence[Lane]) -> list[Lane]:
    """The lanes whose every stage is declared here."""
    return [lane for lane in lanes if all(stage in stages for stage in lane.stages)]


def name_prefix(stages: Iterable[StageAsset]) -> str:
    """What the names of a pipeline's ops, jobs and sensors start with: its assets' key prefix
    (`build_definitions(prefix=...)`), joined by underscores, or nothing."""
    prefixes = {tuple(stage.key.path[:-1]) for stage in stages}
    if len(prefixes) > 1:
        raise ValueError(f"the stages' asset keys have different prefixes: {sorted(prefixes)}")
    prefix = prefixes.pop() if prefixes else []
    return "".join(f"{part}_" for part in prefix)


def lane_jobs(
    stages: Mapping[str, StageAsset],
    lanes: Sequence[Lane],
    executor: dg.ExecutorDefinition | None = None,
) -> dict[str, dg.UnresolvedAssetJobDefinition]:
    """One job per lane: its stages' assets (one multi-asset, one partition set); `executor`, when
    given, is the one its runs use whatever the code location's default."""
    prefix = name_prefix(stages.values())
    return {
        lane.name: dg.define_asset_job(
            f"{prefix}{lane.job_name}",
            selection=[stages[stage].key for stage in lane.stages],
            tags={LANE_TAG: lane.name},
            description=lane.description,
            executor_def=executor,
        )
        for lane in lanes_of(stages, lanes)
    }
