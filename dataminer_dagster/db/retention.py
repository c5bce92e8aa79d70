"""What may be deleted once it has been used, without ever breaking a later project.

* A downloaded video file goes once its frames exist, when every project using the video asks for
  it (`cleanup.delete_videos_after_extraction`). Local source files are never deleted.
* Raw frames of a video go once every project using the video is complete and each of them asks
  for it (`cleanup.delete_frames_when_done`, or `backup.delete_after_backup`), and each project that
  names a backup destination has a verified backup there: never before, whatever else it asks.
* Frames of an extraction profile that no project linked to the video uses any more (their
  `extract:` sections changed) go once the frames of the new profile are extracted.

The videos' rows are locked while their frames are released, so a project linking one of them
meanwhile waits and then finds the frames gone (and has them extracted again). A released
directory is renamed aside in the transaction, which must be one of db/file_changes.py
`committing`: it is deleted once the COMMIT went through and put back otherwise. A crash never
leaves a half-deleted directory that looks present; the hidden sibling it leaves carries the
token of the lease whose completion set it aside, and the next extraction into its place removes
it once that lease is no longer live (core/files.py `remove_leftovers`).

Nothing is lost for good: the catalog forgets the deleted files, and a project that needs them
again re-extracts the frames, re-downloading the video first if it is gone (Catalog.advance_videos).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.file_changes import file_changes
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import SCHEMA

COMPLETE = "complete"


def may_delete_video_file(projects: Sequence[ProjectRow]) -> bool:
    return bool(projects) and all(p.config.cleanup.delete_videos_after_extraction for p in projects)


def delete_video_file(catalog: Catalog, conn: sa.Connection, video_id: str) -> bool:
    """Delete a downloaded (never a local source) video file and forget it: set aside now,
    deleted once `conn`'s transaction has committed (db/file_changes.py). True if deleted."""
    video = catalog.videos.get([video_id])[video_id]
    if video.source_path or not video.file_path:
        return False
    file_changes(conn).set_aside(catalog.paths.absolute(video.file_path))
    catalog.videos.forget_file(conn, video_id)
    return True


@dataclass(frozen=True)
class Released:
    videos: list[str]  # the videos whose frames were released
    # Their frame directories, moved aside in the transaction: deleted once it has committed,
    # put back otherwise (db/file_changes.py).
    aside: list[Path]


def release_finished_frames(
    catalog: Catalog,
    conn: sa.Connection,
    video_ids: Sequence[str],
    *,
    completing: str | None = None,
) -> Released:
    """Release the raw frames of these videos where every linked project is complete (or is
    `completing` now) and allows it."""
    backups = _lock_videos(conn, video_ids)
    videos: list[str] = []
    directories: list[Path] = []
    for video_id, projects in catalog.videos.linked_projects(video_ids, conn).items():
        done = all(p.stage == COMPLETE or p.name == completing for p in projects)
        if not done or not all(_allows_deletion(p, backups.get(video_id, set())) for p in projects):
            continue
        frames = catalog.frames.profiles([video_id]).get(video_id, {})
        if frames:
            directories += [path for path, _ in frames.values()]
            catalog.frames.forget(conn, video_id)
            videos.append(video_id)
    return Released(videos, _set_aside_until_commit(conn, directories))


def release_unused_profiles(catalog: Catalog, conn: sa.Connection, video_id: str) -> Released:
    """Release the video's frames of the extraction profiles that none of its projects uses now
    (their `extract:` changed since): they are re-extracted if a project asks for them again."""
    _lock_videos(conn, [video_id])
    projects = catalog.videos.linked_projects([video_id], conn).get(video_id, [])
    wanted = {p.config.extract.options().profile_id() for p in projects}
    unused = {
        profile: directory
        for profile, (directory, _) in catalog.frames.profiles([video_id]).get(video_id, {}).items()
        if profile not in wanted
    }
    for profile in unused:
        catalog.frames.forget(conn, video_id, profile)
    directories = list(unused.values())
    return Released([video_id] if unused else [], _set_aside_until_commit(conn, directories))


def _allows_deletion(project: ProjectRow, backed_up_to: set[str]) -> bool:
    config = project.config
    backup = config.backup
    if backup and backup.dest not in backed_up_to:
        return False  # the only copy must not go before the backup is verified
    return config.cleanup.delete_frames_when_done or bool(backup and backup.delete_after_backup)


def _lock_videos(conn: sa.Connection, video_ids: Sequence[str]) -> dict[str, set[str]]:
    """Lock the videos' rows until `conn` commits (a link to one, whose foreign key needs a share
    of the row, waits) and return the destinations each was verified at."""
    rows = conn.execute(
        sa.text(
            f"SELECT video_id, backup_dest FROM {SCHEMA}.videos "
            "WHERE video_id = ANY(CAST(:ids AS text[])) ORDER BY video_id FOR UPDATE"
        ),
        {"ids": list(video_ids)},
    ).all()
    return {r.video_id: set((r.backup_dest or "").splitlines()) for r in rows}


def _set_aside_until_commit(conn: sa.Connection, directories: Sequence[Path]) -> list[Path]:
    """Move the directories aside and return their new names: deleted once `conn`'s transaction
    has committed, put back if it does not (db/file_changes.py)."""
    changes = file_changes(conn)
    moved = [changes.set_aside(directory) for directory in directories if directory.is_dir()]
    return [aside for aside in moved if aside is not None]
