"""Administrative operations on the claim tables, behind `dataminer db reset`, `project delete`,
`delete-videos` and `cleanup-orphans` (forcing a stage and retrying, which move a project through
its lifecycle, are in project_lifecycle.py and use the same locks).

Each deletion is one transaction that first locks the work items it is
about to delete or change, then checks that none of them is running: a claim skips locked rows,
so no run can take an item between the check and the change, and running work is never deleted
or reset behind its run's back. With `dry_run` the transaction is rolled back: the result says
what would happen.

Deletions return the files they free and, when asked to delete files, remove them before they
commit (`_remove_before_commit`). A video's files are listed only when the video itself is
deleted, i.e. when no remaining project uses it, and a local source file (`source_path`) is never
listed. A video is used while a project links it or a copy of it (a copy's projects use its
original's frames).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY, VIDEO_STAGES
from dataminer_dagster.core.files import leftovers, remove, set_aside
from dataminer_dagster.db.schema import (
    DONE,
    RUNNING,
    SCHEMA,
    STATUSES,
)
from dataminer_dagster.paths import DataPaths, ProjectPaths, overlaps
from dataminer_dagster.registry import DOWNLOAD, FILTER, FRAMES, project_video_key

S = SCHEMA
W = f"{S}.work_items"


class AdminError(Exception):
    """An operation that cannot be done as asked; the message says why and what to do."""


class UnknownProject(AdminError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"no project named {name!r} (dataminer project list)")


@dataclass(frozen=True)
class RunningItem:
    stage: str
    key: str
    run_id: str

    def describe(self) -> str:
        return f"{self.stage} {self.key} (run {self.run_id})"


class WorkRunning(AdminError):
    """Refused: some of the work items concerned are running."""

    def __init__(self, what: str, running: Sequence[RunningItem]):
        self.running = list(running)
        shown = ", ".join(item.describe() for item in self.running[:5])
        more = f" and {len(self.running) - 5} more" if len(self.running) > 5 else ""
        super().__init__(
            f"{what}: {shown}{more} is running; wait for it to finish, or cancel the run in the "
            "Dagster UI (its items are released), then try again"
        )


# --- the whole schema -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseSummary:
    projects: int
    videos: int
    work_items: int
    running: int


def database_summary(engine: sa.Engine) -> DatabaseSummary:
    with engine.connect() as c:
        row = c.execute(
            sa.text(f"""SELECT (SELECT count(*) FROM {S}.projects) AS projects,
                               (SELECT count(*) FROM {S}.videos) AS videos,
                               (SELECT count(*) FROM {W}) AS work_items,
                               (SELECT count(*) FROM {W} WHERE status = '{RUNNING}') AS running""")
        ).one()
    return DatabaseSummary(row.projects, row.videos, row.work_items, row.running)


def reset_schema(engine: sa.Engine) -> None:
    """Drop the `dataminer` schema with everything in it, then migrate it again (empty).
    Dagster's own storage lives outside the schema and is not touched."""
    from dataminer_dagster.db import migrate

    with engine.begin() as c:
        c.execute(sa.text(f"DROP SCHEMA IF EXISTS {S} CASCADE"))
    migrate.forget(engine)
    migrate.upgrade(engine)


# --- files ----------------------------------------------------------------------------------------


def _video_files(conn: sa.Connection, paths: DataPaths, video_ids: Sequence[str]) -> list[Path]:
    """What a video leaves on disk: its downloaded file (never a local source), its frames and
    its cached embeddings. Only paths that exist."""
    if not video_ids:
        return []
    ids = list(video_ids)
    found: list[Path] = []
    sources: set[Path] = set()
    for r in conn.execute(
        sa.text(f"""SELECT file_path, source_path FROM {S}.videos
                     WHERE video_id = ANY(CAST(:ids AS text[]))"""),
        {"ids": ids},
    ):
        if r.source_path:
            sources.add(Path(r.source_path))
        if r.file_path:
            found.append(paths.absolute(r.file_path))
    for r in conn.execute(
        sa.text(
            f"SELECT frames_dir FROM {S}.video_frames WHERE video_id = ANY(CAST(:ids AS text[]))"
        ),
        {"ids": ids},
    ):
        found.append(paths.absolute(r.frames_dir))
    for video_id in ids:
        found.append(paths.root / "frames" / video_id)  # profiles the database no longer lists
        found.extend(paths.videos_dir.glob(f"{video_id}.*"))  # partial downloads
        found.append(paths.videos_dir / video_id)  # the name its downloads are staged beside
        found.extend(paths.embeddings_dir().glob(f"*/{video_id}.npz"))
    own = [f for f in found if f not in sources]
    # with the hidden siblings a killed run or deletion left: no command would find them later
    return _existing(own + [leftover for f in own for leftover in leftovers(f)])


def _existing(candidates: Sequence[Path]) -> list[Path]:
    """The candidates that exist, without those inside another one (removed with it)."""
    unique = [p for p in dict.fromkeys(Path(c) for c in candidates) if p.exists() or p.is_symlink()]
    return [p for p in unique if not any(o != p and o in p.parents for o in unique)]


# --- transactions and locks -----------------------------------------------------------------------


@contextmanager
def _transaction(engine: sa.Engine, dry_run: bool) -> Iterator[sa.Connection]:
    """One transaction; with `dry_run` it is rolled back, so the caller learns exactly what the
    operation would do (or why it would be refused) without changing anything."""
    with engine.connect() as conn, conn.begin() as transaction:
        yield conn
        if dry_run:
            transaction.rollback()


def lock_project(conn: sa.Connection, name: str) -> sa.Row:
    row = conn.execute(
        sa.text(f"SELECT id, name, stage, output_dir FROM {S}.projects WHERE name = :n FOR UPDATE"),
        {"n": name},
    ).first()
    if row is None:
        raise UnknownProject(name)
    return row


def lock_items(conn: sa.Connection, where: str, params: dict) -> list[sa.Row]:
    """Lock the work items matching `where` (so that no run can claim them in this transaction)
    and return them."""
    return conn.execute(
        sa.text(
            f"SELECT id, stage, item_key, status, lease_owner, video_id FROM {W} w WHERE {where} "
            "ORDER BY id FOR UPDATE"
        ),
        params,
    ).all()


def running_items(items: Sequence[sa.Row]) -> list[RunningItem]:
    return [RunningItem(i.stage, i.item_key, i.lease_owner) for i in items if i.status == RUNNING]


# No project links the video, nor a copy of it (whose projects use its frames).
_UNUSED_SQL = f"""NOT EXISTS (SELECT 1 FROM {S}.project_videos pv WHERE pv.video_id = v.video_id)
    AND NOT EXISTS (SELECT 1 FROM {S}.videos c JOIN {S}.project_videos pv ON pv.video_id = c.video_id
                     WHERE c.same_as = v.video_id)"""


def _lock_unused_videos(conn: sa.Connection, video_ids: Sequence[str]) -> list[str]:
    """Of these videos, those that no project uses, directly or through a copy, locked so that
    no project can link them before this transaction ends (linking needs a key-share lock on the
    video row, and on its original's)."""
    if not video_ids:
        return []
    conn.execute(
        sa.text(f"""SELECT video_id FROM {S}.videos WHERE video_id = ANY(CAST(:ids AS text[]))
                     ORDER BY video_id FOR UPDATE"""),
        {"ids": list(video_ids)},
    )
    # A new statement sees links committed before the lock was granted.
    return list(
        conn.execute(
            sa.text(f"""SELECT v.video_id FROM {S}.videos v
                         WHERE v.video_id = ANY(CAST(:ids AS text[])) AND {_UNUSED_SQL}
                        ORDER BY v.id"""),
            {"ids": list(video_ids)},
        ).scalars()
    )


def _lock_video_items(conn: sa.Connection, video_ids: Sequence[str]) -> list[sa.Row]:
    """Lock the items that belong to these videos alone (download, frames, backup)."""
    return lock_items(
        conn,
        "video_id = ANY(CAST(:ids AS text[])) AND stage = ANY(CAST(:stages AS text[]))",
        {"ids": list(video_ids), "stages": list(VIDEO_STAGES)},
    )


def _delete_videos(conn: sa.Connection, paths: DataPaths, video_ids: Sequence[str]) -> list[Path]:
    """Delete videos (their work items and frame rows go with them); returns their files. The
    caller has locked their items and checked that none is running."""
    if not video_ids:
        return []
    files = _video_files(conn, paths, video_ids)
    conn.execute(
        sa.text(f"DELETE FROM {S}.videos WHERE video_id = ANY(CAST(:ids AS text[]))"),
        {"ids": list(video_ids)},
    )
    return files


def _delete_unused(
    conn: sa.Connection, paths: DataPaths, video_ids: Sequence[str], what: str
) -> list[Path]:
    """Delete videos that nothing uses any more; refuses when one of their items is running."""
    if running := running_items(_lock_video_items(conn, video_ids)):
        raise WorkRunning(what, running)
    return _delete_videos(conn, paths, video_ids)


# --- projects -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectDeletion:
    project: str
    output_dir: Path
    output_dir_kept: str | None  # why nothing in it is deleted (else its own entries are in files)
    videos: int  # videos the project used
    orphaned: list[str]  # videos no other project uses (kept unless delete_unused)
    deleted_videos: list[str]  # of those, deleted with their work items
    files: list[Path]  # the output dir (when it exists) and the deleted videos' files


def delete_project(
    engine: sa.Engine,
    paths: DataPaths,
    name: str,
    *,
    delete_unused_videos: bool = False,
    dry_run: bool = False,
) -> ProjectDeletion:
    """Delete a project: its row, its video links and its work items (filters, catalog, project
    stages). Videos that no other project uses become orphans and stay, with their files, unless
    `delete_unused_videos`. Refuses while one of the items concerned is running."""
    with _transaction(engine, dry_run) as conn:
        project = lock_project(conn, name)
        items = lock_items(conn, "project_id = :p", {"p": project.id})
        if running := running_items(items):
            raise WorkRunning(f"project {name} has running work", running)
        members = list(
            conn.execute(
                sa.text(
                    f"SELECT video_id FROM {S}.project_videos WHERE project_id = :p ORDER BY id"
                ),
                {"p": project.id},
            ).scalars()
        )
        kept = _why_output_dir_stays(conn, paths, project)
        conn.execute(sa.text(f"DELETE FROM {S}.projects WHERE id = :p"), {"p": project.id})
        orphaned = _lock_unused_videos(conn, members)
        deleted: list[str] = []
        files: list[Path] = []
        if delete_unused_videos:
            files = _delete_unused(
                conn, paths, orphaned, f"a video only project {name} uses is being processed"
            )
            deleted = orphaned
        output = ProjectPaths(Path(project.output_dir))
        files = ([] if kept else _existing(output.own_entries())) + files
        if delete_unused_videos and not dry_run:
            _remove_before_commit(files)
    return ProjectDeletion(
        project=name,
        output_dir=output.root,
        output_dir_kept=kept,
        videos=len(members),
        orphaned=orphaned,
        deleted_videos=deleted,
        files=files,
    )


def _why_output_dir_stays(conn: sa.Connection, paths: DataPaths, project: sa.Row) -> str | None:
    """Why nothing in a project's output directory may be deleted, or None: only a directory
    whose marker names the project is its own, and even then not one that overlaps the data
    directory or another project's output (registrations made before the marker existed)."""
    output = ProjectPaths(Path(project.output_dir))
    if output.owner() != project.name:
        return f"it carries no marker naming project {project.name} ({output.marker})"
    found = [
        f"project {r.name}"
        for r in conn.execute(
            sa.text(f"SELECT name, output_dir FROM {S}.projects WHERE id <> :p ORDER BY name"),
            {"p": project.id},
        )
        if overlaps(output.root, Path(r.output_dir))
    ]
    if overlaps(output.root, paths.root) and not output.root.is_relative_to(
        paths.default_project_dir(project.name)
    ):
        found.append(f"the data directory {paths.root}")
    return f"it overlaps {', '.join(found)}" if found else None


@dataclass(frozen=True)
class VideoDeletion:
    project: str
    project_stage: str
    matched: list[str]  # the project's videos with an item in the asked status (not running)
    skipped_running: list[str]  # matched, but one of their items is running: left alone
    had_results: (
        int  # of the matched, videos whose filter was done (they fed the project's outputs)
    )
    orphaned: list[str]  # matched videos no other project uses
    deleted_videos: list[str]  # of those, deleted with their work items
    files: list[Path] = field(default_factory=list)  # filter tables and the deleted videos' files


def _members_with_status(
    conn: sa.Connection, project: sa.Row, status: str
) -> tuple[list[str], set[str], set[str]]:
    """Lock the download, extraction and filter items of a project's videos; returns the videos
    with an item in `status` (in discovery order), those of them with a running item, and those
    whose own filter is done. A video and its copies are one video to the project: when one of
    them has an item in `status` they all do, and when one has a running item they all do."""
    content = dict(
        conn.execute(
            sa.text(f"""SELECT pv.video_id, coalesce(v.same_as, v.video_id) FROM {S}.project_videos pv
                          JOIN {S}.videos v ON v.video_id = pv.video_id
                         WHERE pv.project_id = :p ORDER BY pv.id"""),
            {"p": project.id},
        ).all()
    )
    members = list(content)
    filter_keys = {project_video_key(project.name, v): v for v in members}
    items = lock_items(
        conn,
        f"""(stage IN ('{DOWNLOAD}', '{FRAMES}') AND item_key = ANY(CAST(:videos AS text[])))
            OR (stage = '{FILTER}' AND item_key = ANY(CAST(:keys AS text[])))""",
        {"videos": members, "keys": list(filter_keys)},
    )
    by_video: dict[str, list[sa.Row]] = {}
    for item in items:
        video = filter_keys[item.item_key] if item.stage == FILTER else item.item_key
        by_video.setdefault(video, []).append(item)

    def contents_with(wanted_status: str) -> set[str]:
        return {
            content[v]
            for v in members
            if any(i.status == wanted_status for i in by_video.get(v, []))
        }

    matching, running = contents_with(status), contents_with(RUNNING)
    wanted = [v for v in members if content[v] in matching]
    busy = {v for v in wanted if content[v] in running}
    filtered = {  # a copy's filter item only names its original
        v
        for v in wanted
        if content[v] == v
        and any(i.stage == FILTER and i.status == DONE for i in by_video.get(v, []))
    }
    return wanted, busy, filtered


def delete_project_videos(
    engine: sa.Engine,
    paths: DataPaths,
    name: str,
    status: str,
    *,
    delete_unused_videos: bool = False,
    dry_run: bool = False,
) -> VideoDeletion:
    """Remove from a project the videos whose download, extraction or (this project's) filter
    item has `status`, each with its copies and original (one video to the project). Videos with
    a running item are never removed, and nothing is while one of the project's own stages
    (dedup, detect, dataset) runs. The removed videos' filter items go; videos that no other
    project uses (directly or through a copy) become orphans, or are deleted with
    `delete_unused_videos`."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    with _transaction(engine, dry_run) as conn:
        project = lock_project(conn, name)
        chain = lock_items(
            conn,
            "project_id = :p AND stage = ANY(CAST(:stages AS text[]))",
            {"p": project.id, "stages": list(REGISTRY.project_chain)},
        )
        if running := running_items(chain):  # it reads the filter tables of every member
            raise WorkRunning(f"cannot remove videos from project {name}", running)
        wanted, busy, filtered = _members_with_status(conn, project, status)
        matched = [v for v in wanted if v not in busy]
        conn.execute(
            sa.text(f"""DELETE FROM {W} WHERE stage = '{FILTER}'
                           AND item_key = ANY(CAST(:keys AS text[]))"""),
            {"keys": [project_video_key(name, v) for v in matched]},
        )
        conn.execute(
            sa.text(f"""DELETE FROM {S}.project_videos WHERE project_id = :p
                           AND video_id = ANY(CAST(:ids AS text[]))"""),
            {"p": project.id, "ids": matched},
        )
        orphaned = _lock_unused_videos(conn, matched)
        deleted: list[str] = []
        video_files: list[Path] = []
        if delete_unused_videos:
            video_files = _delete_unused(
                conn, paths, orphaned, f"a {status} video of project {name} is being processed"
            )
            deleted = orphaned
        tables = [ProjectPaths(Path(project.output_dir)).filter_table(v) for v in matched]
        files = _existing(tables) + video_files
        if delete_unused_videos and not dry_run:
            _remove_before_commit(files)
    return VideoDeletion(
        project=name,
        project_stage=project.stage,
        matched=matched,
        skipped_running=[v for v in wanted if v in busy],
        had_results=sum(1 for v in matched if v in filtered),
        orphaned=orphaned,
        deleted_videos=deleted,
        files=files,
    )


# --- orphans --------------------------------------------------------------------------------------


def _orphan_videos(conn: sa.Connection) -> list[str]:
    return list(
        conn.execute(
            sa.text(f"SELECT v.video_id FROM {S}.videos v WHERE {_UNUSED_SQL} ORDER BY v.id")
        ).scalars()
    )


@dataclass(frozen=True)
class OrphanDeletion:
    deleted_videos: list[str]
    skipped_running: list[str]  # orphans with a running item: left for a later cleanup
    kept_with_files: list[str]  # without remove_files: orphans with files on disk, kept
    files: list[Path]  # the deleted videos' files, removed (unless dry_run)


def delete_orphan_videos(
    engine: sa.Engine, paths: DataPaths, *, remove_files: bool = False, dry_run: bool = False
) -> OrphanDeletion:
    """Delete the videos that no project uses (with their work items and frame rows), except
    those with a running item. With `remove_files` their files go too; without, the orphans
    that have files on disk are kept: their rows are how a later cleanup finds those files."""
    with _transaction(engine, dry_run) as conn:
        orphans = _lock_unused_videos(conn, _orphan_videos(conn))
        busy = {i.video_id for i in _lock_video_items(conn, orphans) if i.status == RUNNING}
        free = [v for v in orphans if v not in busy]
        kept = set() if remove_files else {v for v in free if _video_files(conn, paths, [v])}
        deleted = [v for v in free if v not in kept]
        files = _delete_videos(conn, paths, deleted)
        if remove_files and not dry_run:
            _remove_before_commit(files)
    return OrphanDeletion(
        deleted, [v for v in orphans if v in busy], [v for v in free if v in kept], files
    )


def _remove_before_commit(files: Sequence[Path]) -> None:
    """Remove the files of rows that this transaction deletes, before it commits: a crash or a
    failed commit then leaves rows whose files are gone (the next cleanup deletes them; a project
    that links such a video again fetches it again), never files that no row names any more.
    Each path is first renamed to a hidden sibling, in one step, so that it is never left
    half-deleted in its place; a sibling that a crash leaves is found again by `_video_files`."""
    for path in files:
        remove(set_aside(path))
