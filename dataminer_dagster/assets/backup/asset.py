"""frames_backup: raw frames copied to each destination that a project using the video names
(`backup.dest`: a local directory or user@host:/path), with rsync, verified by checksum and file
count. A verified backup may let the frames go (`backup.delete_after_backup`) once no project needs
them any more; see db/retention.py.

A video none of whose projects names a destination has no backup work and no work item: the
frames stage records "nothing to do: no backup configured" on its partition as an observation
(assets/frames/asset.py), so that the UI says why, and a run a person launches for that partition
(a backfill, the UI's Materialize) records it as a materialization with that outcome: it is done,
with nothing done.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dataminer_dagster.assets.backup import NO_BACKUP
from dataminer_dagster.assets.backup.store import record_backup
from dataminer_dagster.core.rsync import copy_tree, is_remote, verify_tree
from dataminer_dagster.db.retention import release_finished_frames
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.paths import check_backup_dest
from dataminer_dagster.registry import BACKUP


def _without_backup(ctx: StageContext, video_ids: Sequence[str]) -> dict[str, dict[str, str]]:
    """The videos, of those that have no backup item, none of whose projects names a backup
    destination: there is nothing to back up."""
    known = ctx.catalog.videos.get(video_ids)
    projects = ctx.catalog.videos.linked_projects(known)
    return {
        video_id: NO_BACKUP
        for video_id in known
        if not any(p.config.backup for p in projects.get(video_id, []))
    }


@stage_asset(
    stage=BACKUP,
    kinds={"rsync"},
    description=(
        "The video's raw frames, copied to every backup destination of its projects and verified."
        " A video whose projects name no backup destination has nothing to back up: the frames "
        "stage records 'nothing to do: no backup configured' on its partition as an observation, "
        "and a backfill or Materialize of the partition records it as done with that outcome."
    ),
    nothing_to_do=_without_backup,
)
def frames_backup(item: StageItem, ctx: StageContext) -> ItemResult:
    """The video's raw frames, copied to every backup destination of its projects and verified."""
    catalog = ctx.catalog
    projects = catalog.videos.linked_projects([item.video_id]).get(item.video_id, [])
    destinations = sorted({p.config.backup.dest for p in projects if p.config.backup})
    if not destinations:
        return ItemResult(metadata=NO_BACKUP)
    recorded = catalog.frames.profiles([item.video_id]).get(item.video_id, {})
    frames = {profile: path for profile, (path, _) in recorded.items() if path.is_dir()}
    if not frames:  # released before a project named this destination, or deleted by hand
        return ItemResult(
            metadata={
                "outcome": "nothing copied yet: the frames are not on disk; they are extracted "
                "again, and backed up after that"
            },
            commit=lambda conn: catalog.advance_videos(conn, [item.video_id]),
        )
    checked = {}
    for dest in destinations:
        if not is_remote(dest):  # registered before registration checked it
            check_backup_dest(Path(dest), ctx.db.paths.root)
        checked[dest] = 0
        for profile, path in sorted(frames.items()):  # not a profile being extracted meanwhile
            target = f"{dest.rstrip('/')}/{item.video_id}/{profile}"
            copy_tree(path, target)
            checked[dest] += verify_tree(path, target)
            ctx.check_lease(item)

    def commit(conn) -> None:  # the frames released are deleted once it has committed
        record_backup(conn, item.video_id, destinations)
        release_finished_frames(catalog, conn, [item.video_id])

    return ItemResult(
        metadata={
            "outcome": "copied and verified",
            "destinations": "\n".join(destinations),
            "files_verified": sum(checked.values()),
        },
        outcome={"destinations": destinations},
        commit=commit,
    )
