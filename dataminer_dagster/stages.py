"""Stage names (the `stage` column of work items), the partition keys they use, and the lanes
that carry them through Dagster runs.

Video stages are keyed by video id, project-video stages by "<project>.<video id>" (video ids never
contain a dot), project stages by the project name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataminer_dagster.settings import LanePolicy, Settings, SettingsError

CATALOG = "catalog"  # per project: find videos, link them
DOWNLOAD = "download"  # per video
FRAMES = "frames"  # per video
FILTER = "filter"  # per project-video
DEDUP = "dedup"  # per project
DETECT = "detect"  # per project
DATASET = "dataset"  # per project
BACKUP = "backup"  # per video

VIDEO_STAGES = (DOWNLOAD, FRAMES, BACKUP)
# The project-level stages that run, in this order, once every member video is finished.
PROJECT_CHAIN = (DEDUP, DETECT, DATASET)
ALL_STAGES = (CATALOG, DOWNLOAD, FRAMES, FILTER, DEDUP, DETECT, DATASET, BACKUP)


def project_video_key(project: str, video_id: str) -> str:
    return f"{project}.{video_id}"


def split_project_video_key(key: str) -> tuple[str, str]:
    project, sep, video_id = key.rpartition(".")
    if not sep or not project or not video_id:
        raise ValueError(f"{key!r} is not a <project>.<video id> key")
    return project, video_id


@dataclass(frozen=True)
class Lane:
    """Stages that share a partition set and follow each other: one Dagster job, so that one run
    carries a batch of partitions through all of them (one process start, resources set up once).

    `ahead`: the run may be requested while the lane's input is still being produced by runs in
    flight; it starts (process, imports) meanwhile and waits for that work before taking any pool
    slot. `warm_up`: modules it imports while it waits."""

    name: str
    stages: tuple[str, ...]
    partitions: str  # the dynamic partitions definition's name
    policy: LanePolicy
    description: str
    ahead: bool = False
    warm_up: tuple[str, ...] = ()

    @property
    def job_name(self) -> str:
        return f"{self.name}_job"


LANES = (
    Lane(
        "catalog",
        (CATALOG,),
        "projects",
        LanePolicy(batch=1, max_runs=2),
        "Find a project's videos (searches, URLs, files) and queue their downloads.",
    ),
    Lane(
        "video",
        (DOWNLOAD, FRAMES),
        "videos",
        LanePolicy(batch=25, max_runs=3),
        "Download a batch of videos, then extract their frames.",
    ),
    Lane(
        "filter",
        (FILTER,),
        "project_videos",
        LanePolicy(batch=200, max_runs=1),
        "Score a batch of project videos' frames against the project's prompts (SigLIP2).",
        ahead=True,
        warm_up=("torch", "transformers"),
    ),
    Lane(
        "project",
        (DEDUP, DETECT, DATASET),
        "projects",
        LanePolicy(batch=1, max_runs=2),
        "Deduplicate a finished project's frames, detect objects, export the dataset.",
        ahead=True,
        warm_up=("torch", "faiss", "ultralytics"),
    ),
    Lane(
        "backup",
        (BACKUP,),
        "videos",
        LanePolicy(batch=50, max_runs=1),
        "Copy a batch of videos' frames to the backup destination (rsync, verified).",
    ),
)
LANES_BY_NAME = {lane.name: lane for lane in LANES}
LANE_OF_STAGE = {stage: lane for lane in LANES for stage in lane.stages}


def configured_lanes(settings: Settings) -> tuple[Lane, ...]:
    """The lanes with the batch sizes and run shares of the settings file."""
    unknown = set(settings.lanes) - set(LANES_BY_NAME)
    if unknown:
        raise SettingsError(
            f"{settings.source or 'settings'}: lanes: unknown lane {', '.join(sorted(unknown))}; "
            f"the lanes are {', '.join(LANES_BY_NAME)}"
        )
    return tuple(
        dataclasses.replace(lane, policy=settings.lane(lane.name, lane.policy)) for lane in LANES
    )
