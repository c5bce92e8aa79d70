"""The registry of stages, and the lanes that carry them through Dagster runs.

Every fact about a stage that another part needs is in its `StageSpec` here: its partition set,
its lane, whether it is in the project chain, on the status boards, forceable, a GPU stage, and
where its asset is. The sensors' run requests, the status tables and progress bars, the CLI's
choices and `force-<stage>` commands, the admin operations and the lease statements' stage lists
are derived from `REGISTRY`. A new stage is its module under assets/ plus one entry here.

Stage names are the `stage` column of work items. Video stages are keyed by video id,
project-video stages by "<project>.<video id>" (video ids never contain a dot), project stages by
the project name. This module imports nothing of Dagster or of the stages' code, so that the
sensors and the database layer can use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dataminer_dagster.settings import LanePolicy, Settings, SettingsError

CATALOG = "catalog"
DOWNLOAD = "download"
FRAMES = "frames"
FILTER = "filter"
DEDUP = "dedup"
DETECT = "detect"
DATASET = "dataset"
BACKUP = "backup"

# The asset groups of the UI, in flow order: getting the frames, then making the dataset.
INGEST = "ingest"  # catalog, downloads, frames, backup
CURATION = "curation"  # filter, dedup, detect, dataset

# The partition sets (Dagster dynamic partitions) a stage's items are keyed in.
PROJECTS = "projects"  # key: the project name
VIDEOS = "videos"  # key: the video id
PROJECT_VIDEOS = "project_videos"  # key: "<project>.<video id>"


@dataclass(frozen=True)
class StageSpec:
    """What the rest of the pipeline needs to know about a stage; the stage's work is its module
    under assets/. `keys`: the partition set. `lane`: the lane (one Dagster job) whose runs carry
    it. `after_members`: a project stage that runs once every member video is finished, in
    registry order (the project chain). `on_board`: a row of the status tables and progress
    bars. `forceable`: `dataminer force-<stage>` runs it again with what follows it. `gpu`: it
    runs a model (GPU op tags, the `gpu` pool). `group`: its asset group in the UI."""

    name: str
    keys: str
    lane: str
    asset: str  # "<module>:<StageAsset>", imported only by assets/__init__.py
    description: str
    group: str = "curation"
    after_members: bool = False
    on_board: bool = True
    forceable: bool = False
    gpu: bool = False

    @property
    def per_video(self) -> bool:
        return self.keys == VIDEOS


class StageRegistry:
    """The stages in flow order, and every list the pipeline derives from them. One process-wide
    instance, `REGISTRY`; `add` and `remove` extend it (a new stage: its module, its entry)."""

    def __init__(self, specs: tuple[StageSpec, ...]):
        self._specs = list(specs)

    @property
    def specs(self) -> tuple[StageSpec, ...]:
        return tuple(self._specs)

    def __getitem__(self, name: str) -> StageSpec:
        for spec in self._specs:
            if spec.name == name:
                return spec
        raise KeyError(f"no stage {name!r}; the stages are {', '.join(self.names)}")

    def add(self, spec: StageSpec, *, after: str) -> None:
        if spec.name in self.names:
            raise ValueError(f"stage {spec.name!r} is registered already")
        if spec.lane not in LANES_BY_NAME:
            raise ValueError(
                f"stage {spec.name!r}: no lane {spec.lane!r} ({', '.join(LANES_BY_NAME)})"
            )
        self._specs.insert(self.names.index(after) + 1, spec)

    def remove(self, name: str) -> None:
        self._specs.remove(self[name])

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._specs)

    @property
    def video_stages(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._specs if s.per_video)

    @property
    def project_chain(self) -> tuple[str, ...]:
        """The project stages that run, in this order, once every member video is finished."""
        return tuple(s.name for s in self._specs if s.after_members)

    @property
    def board(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._specs if s.on_board)

    @property
    def member_board(self) -> tuple[str, ...]:
        """The board's per-video and per-project-video stages: the overview's columns."""
        return tuple(s.name for s in self._specs if s.on_board and s.keys != PROJECTS)

    @property
    def forceable(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._specs if s.forceable)

    def stages_of_lane(self, lane: str) -> tuple[str, ...]:
        return tuple(s.name for s in self._specs if s.lane == lane)


_ASSETS = "dataminer_dagster.assets."
REGISTRY = StageRegistry(
    (
        StageSpec(
            CATALOG,
            PROJECTS,
            "catalog",
            _ASSETS + "catalog:video_catalog",
            "find a project's videos, link them",
            group=INGEST,
        ),
        StageSpec(
            DOWNLOAD,
            VIDEOS,
            "video",
            _ASSETS + "downloads:downloads",
            "download a video",
            group=INGEST,
        ),
        StageSpec(
            FRAMES,
            VIDEOS,
            "video",
            _ASSETS + "frames:frames",
            "extract a video's frames",
            group=INGEST,
        ),
        StageSpec(
            FILTER,
            PROJECT_VIDEOS,
            "filter",
            _ASSETS + "filter:filtered_frames",
            "score a video's frames",
            gpu=True,
        ),
        StageSpec(
            DEDUP,
            PROJECTS,
            "project",
            _ASSETS + "dedup:deduped_set",
            "deduplicate the frames that passed the filter",
            after_members=True,
            forceable=True,
            gpu=True,
        ),
        StageSpec(
            DETECT,
            PROJECTS,
            "project",
            _ASSETS + "detect:detections",
            "detect objects in the deduplicated frames",
            after_members=True,
            forceable=True,
            gpu=True,
        ),
        StageSpec(
            DATASET,
            PROJECTS,
            "project",
            _ASSETS + "dataset:dataset",
            "export the dataset",
            after_members=True,
        ),
        StageSpec(
            BACKUP,
            VIDEOS,
            "backup",
            _ASSETS + "backup:frames_backup",
            "copy a video's frames away",
            on_board=False,
            group=INGEST,
        ),
    )
)

# The per-video stages, for the SQL statements that are built once, at import.
VIDEO_STAGES = REGISTRY.video_stages


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
# and `ultralytics` import lazily, so importing only them warms little. Measured on the demo's
# tiny models (2 cores, imports done first): the filter's first batch 3.2 s after importing torch
# and transformers, 0.4 s after these; YOLO's first detection 1.5-1.7 s after torch and
# ultralytics, 0.2 s after these.
_TORCH_AT_FIRST_USE = ("torch", "torchvision", "torch._dynamo")
_SIGLIP = (
    "transformers.modeling_utils",
    "transformers.models.siglip.modeling_siglip",
    "transformers.models.siglip2.modeling_siglip2",
    "dataminer_dagster.models.siglip",
)
_YOLO = ("ultralytics.nn.tasks", "dataminer_dagster.models.detectors")

LANES = (
    Lane(
        "catalog",
        LanePolicy(batch=1, max_runs=2),
        "Find a project's videos (searches, URLs, files) and queue their downloads.",
    ),
    Lane(
        "video",
        LanePolicy(batch=25, max_runs=3),
        "Download a batch of videos, then extract their frames.",
    ),
    Lane(
        "filter",
        LanePolicy(batch=200, max_runs=1),
        "Score a batch of project videos' frames against the project's prompts (SigLIP2).",
        ahead=True,
        warm_up=(*_TORCH_AT_FIRST_USE, *_SIGLIP),
    ),
    Lane(
        "project",
        LanePolicy(batch=1, max_runs=2),
        "Deduplicate a finished project's frames, detect objects, export the dataset.",
        ahead=True,
        warm_up=(*_TORCH_AT_FIRST_USE, "faiss", *_YOLO),
    ),
    Lane(
        "backup",
        LanePolicy(batch=50, max_runs=1),
        "Copy a batch of videos' frames to the backup destination (rsync, verified).",
    ),
)
LANES_BY_NAME = {lane.name: lane for lane in LANES}


def lane_of(stage: str) -> Lane:
    """The lane whose runs carry `stage`."""
    return LANES_BY_NAME[REGISTRY[stage].lane]


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
