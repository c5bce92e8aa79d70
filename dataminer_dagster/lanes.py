"""The lanes: stages that share a partition set and follow each other, carried by one Dagster job.

`DEFAULT_LANES` are the lanes with their default batch sizes and run shares; `configured_lanes`
applies the settings file to them (definitions.py's `LANES`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.registry import (
    BACKUP_LANE,
    CATALOG_LANE,
    FILTER_LANE,
    PROJECT_LANE,
    VIDEO_LANE,
)
from dataminer_dagster.settings import LanePolicy, Settings, SettingsError


@dataclass(frozen=True)
class Lane:
    """Stages that share a partition set and follow each other: one Dagster job, so that one run
    carries a batch of partitions through all of them (one process start, resources set up once).

    `ahead`: the run may be requested while the lane's input is still being produced by runs in
    flight; it starts (process, imports) meanwhile and waits for that work before taking any pool
    slot. `warm_up`: modules it imports while it waits. `only`: these stages instead of the
    registry's stages of the lane (e.g. a lane per stage, so that runs stop between stages)."""

    name: str
    policy: LanePolicy
    description: str
    ahead: bool = False
    warm_up: tuple[str, ...] = ()
    only: tuple[str, ...] = ()

    @property
    def job_name(self) -> str:
        return f"{self.name}_job"

    @property
    def stages(self) -> tuple[str, ...]:
        """The registry's stages of this lane, in flow order."""
        return self.only or REGISTRY.stages_of_lane(self.name)

    @property
    def partitions(self) -> str:
        """The partition set the lane's stages share (the dynamic partitions' name)."""
        (keys,) = {REGISTRY[stage].keys for stage in self.stages}
        return keys


# What a lane's first item imports, named down to the modules that do the work: `transformers`
# and `ultralytics` import lazily, so importing only them warms little (the first batch's time
# either way: bench/README.md, "Figures behind the code").
_TORCH_AT_FIRST_USE = ("torch", "torchvision", "torch._dynamo")
_SIGLIP = (
    "transformers.modeling_utils",
    "transformers.models.siglip.modeling_siglip",
    "transformers.models.siglip2.modeling_siglip2",
    "dataminer_dagster.models.siglip",
)
_YOLO = ("ultralytics.nn.tasks", "dataminer_dagster.models.detectors")

DEFAULT_LANES = (
    Lane(
        CATALOG_LANE,
        LanePolicy(batch=1, max_runs=2),
        "Find a project's videos (searches, URLs, files) and queue their downloads.",
    ),
    Lane(
        VIDEO_LANE,
        LanePolicy(batch=25, max_runs=3),
        "Download a batch of videos, then extract their frames.",
    ),
    Lane(
        FILTER_LANE,
        LanePolicy(batch=200, max_runs=1),
        "Score a batch of project videos' frames against the project's prompts (SigLIP2).",
        ahead=True,
        warm_up=(*_TORCH_AT_FIRST_USE, *_SIGLIP),
    ),
    Lane(
        PROJECT_LANE,
        LanePolicy(batch=1, max_runs=2),
        "Deduplicate a finished project's frames, detect objects, export the dataset.",
        ahead=True,
        warm_up=(*_TORCH_AT_FIRST_USE, "faiss", *_YOLO),
    ),
    Lane(
        BACKUP_LANE,
        LanePolicy(batch=50, max_runs=1),
        "Copy a batch of videos' frames to the backup destination (rsync, verified).",
    ),
)
LANES_BY_NAME = {lane.name: lane for lane in DEFAULT_LANES}


def lane_of(stage: str) -> Lane:
    """The lane whose runs carry `stage`."""
    return LANES_BY_NAME[REGISTRY[stage].lane]


def configured_lanes(settings: Settings) -> tuple[Lane, ...]:
    """The lanes with the batch sizes, run shares and ahead requests of the settings file."""
    source = settings.source or "settings"
    unknown = set(settings.lanes) - set(LANES_BY_NAME)
    if unknown:
        raise SettingsError(
            f"{source}: lanes: unknown lane {', '.join(sorted(unknown))}; "
            f"the lanes are {', '.join(LANES_BY_NAME)}"
        )
    can_run_ahead = [lane.name for lane in DEFAULT_LANES if lane.ahead]
    lanes = []
    for lane in DEFAULT_LANES:
        override = settings.lanes.get(lane.name)
        ahead = lane.ahead if override is None or override.ahead is None else override.ahead
        if ahead and not lane.ahead:
            raise SettingsError(
                f"{source}: lanes.{lane.name}.ahead: this lane's runs cannot start ahead of their "
                f"input; the lanes that can: {', '.join(can_run_ahead)}"
            )
        policy = settings.lane(lane.name, lane.policy)
        lanes.append(dataclasses.replace(lane, policy=policy, ahead=ahead))
    return tuple(lanes)
