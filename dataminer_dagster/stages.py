"""Stage names (the `stage` column of work items) and the partition keys they use.

Video stages are keyed by video id, project-video stages by "<project>.<video id>" (video ids never
contain a dot), project stages by the project name.
"""

from __future__ import annotations

CATALOG = "catalog"  # per project: find videos, link them
DOWNLOAD = "download"  # per video
FRAMES = "frames"  # per video
FILTER = "filter"  # per project-video
DEDUP = "dedup"  # per project
DETECT = "detect"  # per project
DATASET = "dataset"  # per project
BACKUP = "backup"  # per video

VIDEO_STAGES = (DOWNLOAD, FRAMES, BACKUP)
PROJECT_VIDEO_STAGES = (FILTER,)
PROJECT_STAGES = (CATALOG, DEDUP, DETECT, DATASET)
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
