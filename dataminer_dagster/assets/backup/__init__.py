"""backup: copy a video's frames to the backup destination (rsync, verified)."""

from dataminer_dagster.registry import BACKUP, BACKUP_LANE, FRAMES, INGEST, VIDEOS, StageSpec

STAGE = StageSpec(
    BACKUP,
    VIDEOS,
    lane=BACKUP_LANE,
    asset="frames_backup",
    description="copy a video's frames away",
    reads=FRAMES,
    on_board=False,
    group=INGEST,
    config=("backup",),
    home=__name__,
)

# Recorded on frames_backup for a video none of whose projects names a backup destination: an
# observation from the frames stage, a materialization from a run that targets the partition.
NO_BACKUP = {
    "outcome": "nothing to do: no backup configured (no project of the video has backup.dest)"
}
