"""The lanes' jobs: one Dagster job per lane whose every stage is declared, for the Definitions,
the sensors and `dataminer run` alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import dagster as dg

from dataminer_dagster.engine.lanes import Lane
from dataminer_dagster.tags import LANE_TAG

if TYPE_CHECKING:  # the sensors use this module; they must not import the stage machinery
    from dataminer_dagster.engine.stage import StageAsset


def lanes_of(stages: Mapping[str, StageAsset], lanes: Sequence[Lane]) -> list[Lane]:
    """The lanes whose every stage is declared here."""
    return [lane for lane in lanes if all(stage in stages for stage in lane.stages)]


def lane_jobs(
    stages: Mapping[str, StageAsset], lanes: Sequence[Lane]
) -> dict[str, dg.UnresolvedAssetJobDefinition]:
    """One job per lane: its stages' assets (one multi-asset, one partition set)."""
    return {
        lane.name: dg.define_asset_job(
            lane.job_name,
            selection=[stages[stage].key for stage in lane.stages],
            tags={LANE_TAG: lane.name},
            description=lane.description,
        )
        for lane in lanes_of(stages, lanes)
    }
