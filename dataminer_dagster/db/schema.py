"""The claim-table schema (SQLAlchemy Core). Alembic migrations in migrations/ create it.

All tables live in the `dataminer` schema so that they can share a database with Dagster's own
storage without name clashes. Timestamps are `timestamptz` set from the database clock.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, UUID

from dataminer_dagster.registry import KEY_SEPARATOR

SCHEMA = "dataminer"

# The per-video stages whose progress each project video carries (migration 0014's columns
# `<stage>_status`, `<stage>_finished_at`): the board's per-video stages.
LINK_PROGRESS_STAGES = ("download", "frames")


def project_video_key_sql(project_name: str, video_id: str) -> str:
    """The SQL expression of a project video's key from two column expressions, as
    `project_video_key` builds it in Python."""
    return f"{project_name} || '{KEY_SEPARATOR}' || {video_id}"


def current_fingerprint_sql(item: str) -> str:
    """The SQL expression of the fingerprint the project of work item `item` (an alias of
    work_items) has now for the item's stage (NULL for per-video items)."""
    return f"""(SELECT fp.fingerprints ->> {item}.stage FROM {SCHEMA}.projects fp
                 WHERE fp.id = {item}.project_id)"""


def stale_sql(item: str, current: str | None = None) -> str:
    """SQL: work item `item` was claimed under another config than its project's `current`
    fingerprint (an expression; default: read from the projects table). An item without one (a
    mark, or work finished before fingerprints were kept) is not stale, nor is a copy's item
    (its results are its original's)."""
    current = current or current_fingerprint_sql(item)
    return f"""(coalesce({item}.fingerprint <> {current}, false)
               AND NOT coalesce({item}.outcome ? 'same_as', false))"""


def troubled_sql(prefix: str = "") -> str:
    """SQL: a work item failed, died or was blocked, with an error to show (`prefix`: the item's
    alias and a dot; none in an index's predicate). The latest failures are read with it and the
    `work_items_troubled_*` indexes hold the rows it is true of, so both say it the same way."""
    return (
        f"{prefix}status IN ('{FAILED}', '{DEAD}', '{BLOCKED}') AND {prefix}last_error IS NOT NULL"
    )


def finished_since_sql(item: str) -> str:
    """SQL: work item `item` (an alias) finished (done, dead or blocked) within the last
    `:window_s` seconds (a parameter the statement binds): a stage's throughput."""
    return finished_within_sql(f"{item}.status", f"{item}.finished_at")


def finished_within_sql(status: str, finished_at: str) -> str:
    """SQL: an item of `status` that ended at `finished_at` (column expressions) finished within
    the last `:window_s` seconds."""
    statuses = ", ".join(f"'{s}'" for s in FINISHED)
    return f"""({status} IN ({statuses})
               AND {finished_at} > now() - make_interval(secs => :window_s))"""


# The fingerprint of finished work whose input was made again since (frames extracted again, a
# project stage done again): never a project's current one, so the work is stale and runs again.
INPUT_REDONE = "input made again"


# Work-item statuses. `failed` waits for its back-off and is claimable again; `dead` and `blocked`
# are terminal (dead: tried too often or failed permanently; blocked: skipped by a rule).
PENDING, RUNNING, DONE, FAILED, DEAD, BLOCKED = (
    "pending",
    "running",
    "done",
    "failed",
    "dead",
    "blocked",
)
STATUSES = (PENDING, RUNNING, DONE, FAILED, DEAD, BLOCKED)
CLAIMABLE = (PENDING, FAILED)
FINISHED = (DONE, DEAD, BLOCKED)

# How a project came to a video; `copy`: through a copy of it (the link is the catalog's own).
LINKED_THROUGH_COPY = "copy"

# Above every id of a bigint column (the catalog's ids, Dagster's): where a read from the end starts.
LARGEST_ID = 2**63 - 1

PROJECT_VIDEO_SOURCES = (
    "search",
    "url",
    "url_file",
    "file",
    "manual",
    LINKED_THROUGH_COPY,
    "listing",
)

metadata = sa.MetaData(schema=SCHEMA)

_now = sa.text("now()")


def _timestamps() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    ]


projects = sa.Table(
    "projects",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("config", JSONB, nullable=False),
    sa.Column("config_hash", sa.Text, nullable=False),
    sa.Column("output_dir", sa.Text, nullable=False),
    sa.Column("stage", sa.Text, nullable=False, server_default="active"),
    sa.Column("stage_changed_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Column("error", sa.Text),
    # {project stage: fingerprint of the config its output depends on} (ProjectConfig.fingerprints)
    sa.Column("fingerprints", JSONB),
    # A refresh asked for and not yet done: the next catalog run links only new videos.
    sa.Column("refresh_requested_at", sa.DateTime(timezone=True)),
    # A project with a target: {round, state, reason, decided_at} (db/acquisition_rounds.py)
    sa.Column("acquisition", JSONB),
    *_timestamps(),
    sa.CheckConstraint("name ~ '^[A-Za-z0-9_-]{1,64}$'", name="project_name_safe"),
)

# One row per search and listing of a project ("search: <query>", "listing: <url>"): what its
# last listing found, and, for a source that failed, why and when it is asked again.
project_sources = sa.Table(
    "project_sources",
    metadata,
    sa.Column(
        "project_id",
        sa.Integer,
        sa.ForeignKey(f"{SCHEMA}.projects.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("source", sa.Text, primary_key=True),
    sa.Column("listed_at", sa.DateTime(timezone=True)),  # the last listing that worked
    sa.Column("videos_listed", sa.Integer, nullable=False, server_default="0"),  # by that listing
    sa.Column("videos_new", sa.Integer, nullable=False, server_default="0"),  # new to the project
    sa.Column("failures", sa.Integer, nullable=False, server_default="0"),  # in a row
    sa.Column("last_error", sa.Text),
    sa.Column("retry_at", sa.DateTime(timezone=True)),  # a failing source waits until then
    *_timestamps(),
)

videos = sa.Table(
    "videos",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),  # discovery order
    sa.Column("video_id", sa.Text, nullable=False, unique=True),
    sa.Column("url", sa.Text),  # remote source
    sa.Column("source_path", sa.Text),  # local source file (never deleted by cleanup)
    sa.Column(
        "file_path", sa.Text
    ),  # the video file we decode: relative to the data dir, or source_path
    sa.Column("size_bytes", sa.BigInteger),
    sa.Column("title", sa.Text),
    sa.Column("duration_s", sa.Float),
    sa.Column("fps", sa.Float),
    sa.Column("width", sa.Integer),
    sa.Column("height", sa.Integer),
    sa.Column("uploader", sa.Text),
    sa.Column("upload_date", sa.Text),
    sa.Column("tags", JSONB),
    sa.Column("backed_up_at", sa.DateTime(timezone=True)),
    sa.Column("backup_dest", sa.Text),
    # SHA-256 of the file's bytes, computed once by the download stage: the video's content identity.
    sa.Column("content_hash", sa.Text),
    # The earlier video with the same content, which this one is processed as (a copy's chain ends
    # at its download; its projects use the original's frames). Always an original, never a copy.
    sa.Column("same_as", sa.Text, sa.ForeignKey(f"{SCHEMA}.videos.video_id", ondelete="SET NULL")),
    *_timestamps(),
    sa.CheckConstraint("video_id ~ '^[A-Za-z0-9_-]{1,64}$'", name="video_id_safe"),
    sa.CheckConstraint("url IS NOT NULL OR source_path IS NOT NULL", name="video_has_source"),
    sa.CheckConstraint("same_as <> video_id", name="video_not_same_as_itself"),
    sa.Index(
        "videos_content_hash", "content_hash", postgresql_where=sa.text("content_hash IS NOT NULL")
    ),
    sa.Index("videos_same_as", "same_as", postgresql_where=sa.text("same_as IS NOT NULL")),
)

# One row per (video, extraction profile): projects with different sampling needs get their own
# frames instead of silently sharing whichever profile ran first.
video_frames = sa.Table(
    "video_frames",
    metadata,
    sa.Column(
        "video_id",
        sa.Text,
        sa.ForeignKey(f"{SCHEMA}.videos.video_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("profile_id", sa.Text, primary_key=True),
    sa.Column("options", JSONB, nullable=False),
    sa.Column("frames_dir", sa.Text, nullable=False),  # relative to the data dir
    sa.Column("frame_count", sa.Integer, nullable=False),
    *_timestamps(),
)

project_videos = sa.Table(
    "project_videos",
    metadata,
    sa.Column(
        "project_id",
        sa.Integer,
        sa.ForeignKey(f"{SCHEMA}.projects.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column(
        "video_id",
        sa.Text,
        sa.ForeignKey(f"{SCHEMA}.videos.video_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False, unique=True),  # discovery order
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("source_info", sa.Text),
    sa.Column("frames_total", sa.Integer),
    sa.Column("frames_passed", sa.Integer),
    sa.Column("frames_kept", sa.Integer),  # by the project's dedup
    # The video's progress, copied from its items and its row (db/link_progress.py; migration
    # 0014): exact only while the video has no note in video_changes.
    *(
        column
        for stage in LINK_PROGRESS_STAGES
        for column in (
            sa.Column(f"{stage}_status", sa.Text),
            sa.Column(f"{stage}_finished_at", sa.DateTime(timezone=True)),
        )
    ),
    sa.Column("duration_s", sa.Float),
    sa.Column("size_bytes", sa.BigInteger),
    *_timestamps(),
    # `copy`: linked to the original because the project links a copy of it (source_info: the copy)
    sa.CheckConstraint(
        f"source IN {PROJECT_VIDEO_SOURCES!r}",
        name="pv_source",
    ),
    sa.Index("project_videos_video", "video_id"),
)

work_items = sa.Table(
    "work_items",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("stage", sa.Text, nullable=False),
    sa.Column("item_key", sa.Text, nullable=False),  # = the Dagster partition key
    sa.Column("project_id", sa.Integer, sa.ForeignKey(f"{SCHEMA}.projects.id", ondelete="CASCADE")),
    sa.Column("video_id", sa.Text, sa.ForeignKey(f"{SCHEMA}.videos.video_id", ondelete="CASCADE")),
    sa.Column("status", sa.Text, nullable=False, server_default=PENDING),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Column("lease_owner", sa.Text),  # Dagster run id
    sa.Column("lease_token", UUID(as_uuid=True)),
    sa.Column("leased_at", sa.DateTime(timezone=True)),
    # NULL while claimed but not begun; kept once done (with finished_at: how long it took)
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("requested_at", sa.DateTime(timezone=True)),  # when a sensor last asked for a run
    sa.Column("last_error", sa.Text),
    sa.Column("outcome", JSONB),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    # The project's fingerprint of this stage when the item was last claimed (project stages only):
    # the config its output was made with; another than the project's current one means stale.
    sa.Column("fingerprint", sa.Text),
    # The token of the lease whose completion finished the item: a holder whose connection was
    # lost during the COMMIT reads back whether it went through (db/file_changes.py).
    sa.Column("finished_token", UUID(as_uuid=True)),
    *_timestamps(),
    sa.UniqueConstraint("stage", "item_key", name="work_items_stage_key"),
    sa.CheckConstraint(f"status IN {STATUSES!r}", name="work_item_status"),
    sa.CheckConstraint("(status = 'running') = (lease_token IS NOT NULL)", name="work_item_lease"),
    # Claims walk this in due order and stop at the first item not yet due: rows waiting for
    # their back-off and finished rows are never visited, however many there are.
    sa.Index(
        "work_items_claimable",
        "stage",
        "next_attempt_at",
        "id",
        postgresql_where=sa.text("status IN ('pending', 'failed')"),
    ),
    sa.Index("work_items_running", "lease_owner", postgresql_where=sa.text("status = 'running'")),
    # What the sensors asked runs for lately, still waiting to be claimed: the start of the work
    # that is in flight (db/scheduling.py `coming`).
    sa.Index(
        "work_items_requested",
        "requested_at",
        postgresql_where=sa.text("status IN ('pending', 'failed') AND requested_at IS NOT NULL"),
    ),
    # Per-video items have no project and project items no video: leaving the NULLs out spares
    # every update of those rows an index entry.
    sa.Index(
        "work_items_project",
        "project_id",
        "stage",
        "status",
        postgresql_where=sa.text("project_id IS NOT NULL"),
    ),
    sa.Index("work_items_video", "video_id", postgresql_where=sa.text("video_id IS NOT NULL")),
    # The lease reaper's "usual time" of a stage: its last finished items, whatever the history.
    sa.Index(
        "work_items_finished",
        "stage",
        sa.text("finished_at DESC"),
        postgresql_where=sa.text("status = 'done'"),
    ),
    # A project's latest failures, newest first (`dataminer status NAME`): its own, its videos'.
    sa.Index(
        "work_items_troubled_own",
        "project_id",
        sa.text("updated_at DESC"),
        postgresql_where=sa.text(f"{troubled_sql()} AND project_id IS NOT NULL"),
    ),
    sa.Index(
        "work_items_troubled_videos",
        sa.text("updated_at DESC"),
        postgresql_where=sa.text(f"{troubled_sql()} AND project_id IS NULL"),
    ),
)

# Projects whose state changed since `advance_projects` last looked (db/project_flow.py): written
# by triggers on projects, project_videos and work_items, in the transaction of each change
# (migration 0011 holds the triggers), removed by the call that acted on them.
project_changes = sa.Table(
    "project_changes",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("project_id", sa.Integer, nullable=False),
)

# The videos whose progress on their links is behind: triggers note a video, in the transaction of
# the change, when its download or extraction item moves, its length or size changes or it is
# linked (migration 0014); db/link_progress.py copies their state and removes the notes.
video_changes = sa.Table(
    "video_changes",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("video_id", sa.Text, nullable=False),
)

# How many rows projects, videos and project_videos hold, as deltas: triggers append one per
# statement that inserts or deletes their rows (migration 0012); db/delta_counts.py sums them.
row_counts = sa.Table(
    "row_counts",
    metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("table_name", sa.Text, nullable=False),
    sa.Column("delta", sa.BigInteger, nullable=False),
    sa.Index("row_counts_table", "table_name", "id"),
)

run_heartbeats = sa.Table(
    "run_heartbeats",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("process_space", sa.Text),  # where `pid` can be looked up (core/process_liveness.py)
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Index("run_heartbeats_at", "heartbeat_at"),
)

# The data directory this database serves (db/served_data.py): one row, written at first use.
served_data_dir = sa.Table(
    "served_data_dir",
    metadata,
    sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.true()),
    sa.Column("marker", sa.Text, nullable=False),  # also in the directory's marker file
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.CheckConstraint("singleton", name="served_data_dir_one_row"),
)

# The last dataset version number given to each project (assets/dataset/store.py): allocated
# under this row's lock, never given twice.
dataset_version_numbers = sa.Table(
    "dataset_version_numbers",
    metadata,
    sa.Column(
        "project_id",
        sa.Integer,
        sa.ForeignKey(f"{SCHEMA}.projects.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("last_number", sa.Integer, nullable=False),
)

# Each dataset version number given out and not yet published, with its build's lease token
# (assets/dataset/store.py): a number whose build's lease died unpublished is given again.
dataset_version_holders = sa.Table(
    "dataset_version_holders",
    metadata,
    sa.Column(
        "project_id",
        sa.Integer,
        sa.ForeignKey(f"{SCHEMA}.projects.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("number", sa.Integer, primary_key=True),
    sa.Column("lease_token", UUID(as_uuid=True), nullable=False),
)

# The outputs each lease is staging (db/file_changes.py): a row outlives its item's end only when
# the worker died with its staging on disk, which the lease reaper then removes.
staged_outputs = sa.Table(
    "staged_outputs",
    metadata,
    sa.Column("lease_token", UUID(as_uuid=True), primary_key=True),
    sa.Column("final_path", sa.Text, primary_key=True),
)

# When the lease reaper first saw an unfinished run in a status (engine/run_health.py): its start
# grace and queue timeout are judged from this, on the database's clock.
run_sightings = sa.Table(
    "run_sightings",
    metadata,
    sa.Column("run_id", sa.Text, primary_key=True),
    sa.Column("status", sa.Text, primary_key=True),
    sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
)

# What each lease reaper (by host and pid) saw of the database: when its last pass began, and when
# the last outage it met ended. No run's silence is counted from before that end
# (db/run_liveness.py): time the database was away counts against no run.
reaper_outages = sa.Table(
    "reaper_outages",
    metadata,
    sa.Column("reaper", sa.Text, primary_key=True),
    sa.Column("passed_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Column("outage_ended_at", sa.DateTime(timezone=True)),
    sa.Column("outage_s", sa.Float),  # how long that outage lasted, as the reaper measured it
)

# Hosts that said "stop" (429, 503, a bot check, a Retry-After): no run sends them a request before
# `paused_until` (db/host_pauses.py). One row per throttle key (a host, or a host via a proxy),
# kept after the pause ends: `strikes` (pauses in a row without a success) sets the next pause.
host_pauses = sa.Table(
    "host_pauses",
    metadata,
    sa.Column("host", sa.Text, primary_key=True),
    sa.Column("paused_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Column("paused_until", sa.DateTime(timezone=True), nullable=False),
    sa.Column("kind", sa.Text, nullable=False),  # rate limited, overloaded, bot check, ...
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("strikes", sa.Integer, nullable=False, server_default="0"),
    sa.Column("pauses", sa.Integer, nullable=False, server_default="0"),  # how many, ever
    sa.Column("run_id", sa.Text),  # the run that met the throttle
    *_timestamps(),
)

# Downloads in progress per host, across every run: a download holds a row while it runs (its
# run's heartbeat keeps the row alive; a stale run's rows are taken over).
download_slots = sa.Table(
    "download_slots",
    metadata,
    sa.Column("token", UUID(as_uuid=True), primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("run_id", sa.Text, nullable=False),
    sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False, server_default=_now),
    sa.Index("download_slots_host", "host"),
)
