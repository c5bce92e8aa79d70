"""What the pipeline knows of a stage: its `StageSpec`, and the `StageRegistry` of them in flow order.

Every fact about a stage that another part needs is in its `StageSpec`: its partition set, its
lane, the stage it reads from, whether it is in the project chain, on the status boards,
forceable, a GPU stage, how many items a run works on at once, and its folder. A stage declares
its spec in its folder's `__init__.py` (`assets/<stage>/`); `dataminer_dagster.assets.REGISTRY`
lists them in flow order. The sensors' run requests, the status tables and progress bars, the CLI's
choices and `force-<stage>` commands, the admin operations and the lease statements' stage lists
are derived from it. The per-video chain's own rules (what a video needs next, db/catalog.py
`advance_videos`; what is coming to the filter, db/scheduling.py) name the video stages they are
about.

Stage names are the `stage` column of work items. Video stages are keyed by video id,
project-video stages by "<project>.<video id>" (video ids never contain a dot), project stages by
the project name. This module imports nothing of Dagster or of the stages' code, so that the
sensors and the database layer can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

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

# The lanes (lanes.py: one Dagster job each) a stage's runs are carried by, in flow order.
CATALOG_LANE = "catalog"
VIDEO_LANE = "video"
FILTER_LANE = "filter"
PROJECT_LANE = "project"
BACKUP_LANE = "backup"
LANE_NAMES = (CATALOG_LANE, VIDEO_LANE, FILTER_LANE, PROJECT_LANE, BACKUP_LANE)


@dataclass(frozen=True)
class StageSpec:
    """What the rest of the pipeline needs to know about a stage; the stage's work is the
    `@stage_asset` in its folder's `asset.py`. `keys`: the partition set. `lane`: the lane (one
    Dagster job) whose runs carry it. `asset`: its Dagster asset's name. `reads`: the stage whose
    output it reads (its asset's upstream). `after_members`: a project stage that runs once every
    member video is finished, in registry order (the project chain). `on_board`: a row of the
    status tables and progress bars. `forceable`: `dataminer force-<stage>` runs it again with
    what follows it. `gpu`: it runs a model (GPU op tags, the `gpu` pool). `group`: its asset
    group in the UI. `home`: its folder's package (`__name__` of the folder's `__init__.py`).
    `config`: the sections of the project config (ProjectConfig fields) its output depends on;
    with its upstream's, they make the stage's fingerprint (ProjectConfig.fingerprints): work
    done under another fingerprint than its project's current one is stale, and done again.
    `at_once`: items of a run worked on at the same time (threads), for a stage that waits on the
    network, so that one slow item does not hold up the rest of its batch."""

    name: str
    keys: str
    lane: str
    asset: str
    description: str
    home: str
    reads: str | None = None
    config: tuple[str, ...] = ()
    group: str = CURATION
    after_members: bool = False
    on_board: bool = True
    forceable: bool = False
    gpu: bool = False
    at_once: int = 1

    @property
    def per_video(self) -> bool:
        return self.keys == VIDEOS


class StageRegistry:
    """The stages in flow order, and every list the pipeline derives from them. One process-wide
    instance, `dataminer_dagster.assets.REGISTRY`; `add` and `remove` extend it (a new stage: its
    folder, then `add` or its entry in that list)."""

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
        if spec.lane not in LANE_NAMES:
            raise ValueError(
                f"stage {spec.name!r}: no lane {spec.lane!r} ({', '.join(LANE_NAMES)})"
            )
        position = self.names.index(after) + 1
        if spec.reads is not None and spec.reads not in self.names[:position]:
            raise ValueError(
                f"stage {spec.name!r} reads {spec.reads!r}, which comes after it or is not "
                f"registered ({', '.join(self.names)})"
            )
        self._specs.insert(position, spec)

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


# Between the project and the video id in a project video's key; SQL that builds the key
# (db/catalog.py, db/partition_rows.py) takes it from here.
KEY_SEPARATOR = "."


def project_video_key(project: str, video_id: str) -> str:
    return f"{project}{KEY_SEPARATOR}{video_id}"


def split_project_video_key(key: str) -> tuple[str, str]:
    project, sep, video_id = key.rpartition(KEY_SEPARATOR)
    if not sep or not project or not video_id:
        raise ValueError(f"{key!r} is not a <project>.<video id> key")
    return project, video_id
