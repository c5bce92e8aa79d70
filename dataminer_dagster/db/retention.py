"""What may be deleted once it has been used, without ever breaking a later project.

* A downloaded video file goes once its frames exist, when every project using the video asks for
  it (`cleanup.delete_videos_after_extraction`). Local source files are never deleted.
* Raw frames of a video go once every project using the video is complete and each of them asks
  for it (`cleanup.delete_frames_when_done`, or `backup.delete_after_backup` with a verified backup
  to that project's destination).

Nothing is lost for good: the catalog forgets the deleted files, and a project that needs them
again re-extracts the frames, re-downloading the video first if it is gone (Catalog.advance_videos).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import sqlalchemy as sa

from dataminer_dagster.db.catalog import Catalog, ProjectRow

COMPLETE = "complete"


def may_delete_video_file(projects: Sequence[ProjectRow]) -> bool:
    return bool(projects) and all(p.config.cleanup.delete_videos_after_extraction for p in projects)


def delete_video_file(catalog: Catalog, conn: sa.Connection, video_id: str) -> bool:
    """Delete a downloaded (never a local source) video file and forget it. True if deleted."""
    video = catalog.videos([video_id])[video_id]
    if video.source_path or not video.file_path:
        return False
    catalog.paths.absolute(video.file_path).unlink(missing_ok=True)
    catalog.forget_video_file(conn, video_id)
    return True


def release_finished_frames(
    catalog: Catalog,
    conn: sa.Connection,
    video_ids: Sequence[str],
    *,
    completing: str | None = None,
) -> list[str]:
    """Delete the raw frames of these videos where every linked project is complete (or is
    `completing` now) and allows it. Returns the videos whose frames were deleted."""
    released = []
    backups = _verified_backups(conn, video_ids)
    for video_id, projects in catalog.linked_projects(video_ids).items():
        done = all(p.stage == COMPLETE or p.name == completing for p in projects)
        if not done or not all(_allows_deletion(p, backups.get(video_id, set())) for p in projects):
            continue
        frames = catalog.frame_profiles([video_id]).get(video_id, {})
        for directory, _ in frames.values():
            shutil.rmtree(directory, ignore_errors=True)
        if frames:
            catalog.forget_frames(conn, video_id)
            released.append(video_id)
    return released


def _allows_deletion(project: ProjectRow, backed_up_to: set[str]) -> bool:
    config = project.config
    if config.cleanup.delete_frames_when_done:
        return True
    backup = config.backup
    return bool(backup and backup.delete_after_backup and backup.dest in backed_up_to)


def _verified_backups(conn: sa.Connection, video_ids: Sequence[str]) -> dict[str, set[str]]:
    rows = conn.execute(
        sa.text(
            "SELECT video_id, backup_dest FROM dataminer.videos WHERE video_id = ANY(CAST(:ids AS text[]))"
        ),
        {"ids": list(video_ids)},
    ).all()
    return {r.video_id: set((r.backup_dest or "").splitlines()) for r in rows}
