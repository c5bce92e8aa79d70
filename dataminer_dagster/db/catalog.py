"""Projects, videos and their membership, and the rule that decides each video's next work item.

`advance_videos` is the one place that knows the per-video chain (download -> frames -> each linked
project's filter). It derives the next work from the current state, so it is idempotent and can be
called after any change: new links, a finished download or extraction, files that went missing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dataminer_dagster.config import ProjectConfig
from dataminer_dagster.core.rsync import is_remote
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import BLOCKED, DEAD, DONE, FAILED, RUNNING, SCHEMA
from dataminer_dagster.engine.registry import (
    BACKUP,
    CATALOG,
    DOWNLOAD,
    FILTER,
    FRAMES,
    project_video_key,
)
from dataminer_dagster.paths import DataPaths, check_backup_dest, claim_output_dir

S = SCHEMA


@dataclass(frozen=True)
class ProjectRow:
    id: int
    name: str
    config: ProjectConfig
    config_hash: str
    output_dir: Path
    stage: str
    error: str | None


@dataclass(frozen=True)
class VideoRow:
    video_id: str
    url: str | None
    source_path: str | None
    file_path: str | None
    title: str | None
    duration_s: float | None
    fps: float | None
    width: int | None
    height: int | None
    tags: list[str] | None


@dataclass(frozen=True)
class Candidate:
    """A video found by the catalog: a remote URL or a local file, and where it came from."""

    video_id: str
    source: str  # search | url | url_file | file | manual
    source_info: str | None = None
    url: str | None = None
    source_path: str | None = None


@dataclass(frozen=True)
class LinkResult:
    new_videos: int
    new_links: int
    already_linked: int
    queued: int = 0  # work items queued by `link_and_queue`


@dataclass(frozen=True)
class RegisterResult:
    project: ProjectRow
    created: bool
    changed: bool


class Catalog:
    def __init__(
        self,
        engine: sa.Engine,
        store: LeaseStore,
        paths: DataPaths,
        *,
        requested_stages: frozenset[str] = frozenset(),
    ):
        self.engine = engine
        self.store = store
        self.paths = paths
        # Stages that the run using this catalog executes next: the items it queues for them
        # are marked requested (by that run), not left for the sensors to ask another run for.
        self.requested_stages = requested_stages

    # --- projects -------------------------------------------------------------------------

    def register_project(
        self, config: ProjectConfig, *, protected: Mapping[str, Path] | None = None
    ) -> RegisterResult:
        """Create or update a project; a new or changed config queues its catalog run.

        Its output directory must be one it may own (`paths.claim_output_dir`; `protected` adds
        directories to the data directory, which is always protected); registrations take turns,
        so two projects cannot claim one directory at once. Raises UnsafePathError."""
        output_dir = config.output_dir or self.paths.default_project_dir(config.name)
        config_hash = config.config_hash()
        statement = sa.text(f"""
            INSERT INTO {S}.projects (name, config, config_hash, output_dir)
            VALUES (:name, CAST(:config AS jsonb), :hash, :output_dir)
            ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, config_hash = EXCLUDED.config_hash,
                   output_dir = EXCLUDED.output_dir, updated_at = now()
            RETURNING id, (xmax = 0) AS created,
                      (SELECT config_hash FROM {S}.projects WHERE name = :name) AS previous_hash
        """)
        with self.engine.begin() as c:
            c.execute(sa.text(f"LOCK TABLE {S}.projects IN SHARE ROW EXCLUSIVE MODE"))
            others = c.execute(
                sa.text(f"SELECT name, output_dir FROM {S}.projects WHERE name <> :name"),
                {"name": config.name},
            ).all()
            if config.backup and not is_remote(config.backup.dest):
                check_backup_dest(Path(config.backup.dest), self.paths.root)
            claim_output_dir(
                output_dir,
                config.name,
                protected={"the data directory": self.paths.root, **(protected or {})},
                projects_dir=self.paths.default_project_dir(config.name).parent,
                others={r.name: Path(r.output_dir) for r in others},
            )
            row = c.execute(
                statement,
                {
                    "name": config.name,
                    "config": json.dumps(config.to_json()),
                    "hash": config_hash,
                    "output_dir": str(output_dir),
                },
            ).one()
            changed = row.created or row.previous_hash != config_hash
            self.store.enqueue(
                CATALOG,
                [config.name],
                project_ids=[row.id],
                reset=(DONE, FAILED, DEAD) if changed else (),
                conn=c,
            )
        return RegisterResult(self.project(config.name), bool(row.created), bool(changed))

    def project(self, name: str) -> ProjectRow | None:
        rows = self._projects("WHERE name = :name", {"name": name})
        return rows[0] if rows else None

    def projects(self) -> list[ProjectRow]:
        return self._projects("ORDER BY name", {})

    def _projects(
        self, clause: str, params: dict, conn: sa.Connection | None = None
    ) -> list[ProjectRow]:
        with self._reading(conn) as c:
            rows = c.execute(sa.text(f"SELECT * FROM {S}.projects {clause}"), params).all()
        return [
            ProjectRow(
                id=r.id,
                name=r.name,
                config=ProjectConfig.model_validate(r.config),
                config_hash=r.config_hash,
                output_dir=Path(r.output_dir),
                stage=r.stage,
                error=r.error,
            )
            for r in rows
        ]

    def member_counts(self) -> dict[int, int]:
        """{project id: number of linked videos}"""
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"SELECT project_id, count(*) FROM {S}.project_videos GROUP BY 1")
            ).all()
        return dict(rows)

    # --- videos and membership --------------------------------------------------------------

    def link_videos(
        self, conn: sa.Connection, project: ProjectRow, candidates: Sequence[Candidate]
    ) -> LinkResult:
        """Add unseen videos and link all candidates to the project (idempotent)."""
        if not candidates:
            return LinkResult(0, 0, 0)
        new_videos = conn.execute(
            sa.text(f"""
                INSERT INTO {S}.videos (video_id, url, source_path)
                SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:urls AS text[]), CAST(:paths AS text[]))
                ON CONFLICT (video_id) DO NOTHING RETURNING video_id
            """),
            {
                "ids": [c.video_id for c in candidates],
                "urls": [c.url for c in candidates],
                "paths": [c.source_path for c in candidates],
            },
        ).all()
        # The links' foreign keys take a share of each video row in discovery order; taken here
        # first, in id order, as a release of frames takes the rows (db/retention.py): the two
        # cannot deadlock.
        conn.execute(
            sa.text(f"""SELECT 1 FROM {S}.videos WHERE video_id = ANY(CAST(:ids AS text[]))
                         ORDER BY video_id FOR KEY SHARE"""),
            {"ids": [c.video_id for c in candidates]},
        )
        new_links = conn.execute(
            sa.text(f"""
                INSERT INTO {S}.project_videos (project_id, video_id, source, source_info)
                SELECT :project, * FROM unnest(CAST(:ids AS text[]), CAST(:sources AS text[]), CAST(:infos AS text[]))
                ON CONFLICT (project_id, video_id) DO NOTHING RETURNING video_id
            """),
            {
                "project": project.id,
                "ids": [c.video_id for c in candidates],
                "sources": [c.source for c in candidates],
                "infos": [c.source_info for c in candidates],
            },
        ).all()
        return LinkResult(len(new_videos), len(new_links), len(candidates) - len(new_links))

    def videos(self, video_ids: Iterable[str]) -> dict[str, VideoRow]:
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"SELECT * FROM {S}.videos WHERE video_id = ANY(CAST(:ids AS text[]))"),
                {"ids": list(video_ids)},
            ).all()
        return {
            r.video_id: VideoRow(
                video_id=r.video_id,
                url=r.url,
                source_path=r.source_path,
                file_path=r.file_path,
                title=r.title,
                duration_s=r.duration_s,
                fps=r.fps,
                width=r.width,
                height=r.height,
                tags=r.tags,
            )
            for r in rows
        }

    def _reading(self, conn: sa.Connection | None) -> contextlib.AbstractContextManager:
        """`conn` itself (its transaction goes on), or a connection of its own."""
        return contextlib.nullcontext(conn) if conn is not None else self.engine.connect()

    def linked_projects(
        self, video_ids: Iterable[str], conn: sa.Connection | None = None
    ) -> dict[str, list[ProjectRow]]:
        """The projects each video is linked to; read in `conn`'s transaction when given."""
        with self._reading(conn) as c:
            links = c.execute(
                sa.text(f"""SELECT pv.video_id, p.name FROM {S}.project_videos pv JOIN {S}.projects p
                            ON p.id = pv.project_id WHERE pv.video_id = ANY(CAST(:ids AS text[]))
                            ORDER BY p.name"""),
                {"ids": list(video_ids)},
            ).all()
        projects = {
            p.name: p
            for p in self._projects(
                "WHERE name = ANY(CAST(:n AS text[]))", {"n": [r.name for r in links]}, conn
            )
        }
        result: dict[str, list[ProjectRow]] = defaultdict(list)
        for r in links:
            result[r.video_id].append(projects[r.name])
        return dict(result)

    def record_video_file(
        self, conn: sa.Connection, video_id: str, file_path: str | None, meta: dict[str, Any]
    ) -> None:
        """Store where the decodable file is and what it holds (title, duration, fps, size, tags...);
        facts not given keep their stored value."""
        conn.execute(
            sa.text(f"""
                UPDATE {S}.videos SET file_path = :file_path,
                       size_bytes = COALESCE(:size_bytes, size_bytes), title = COALESCE(:title, title),
                       duration_s = COALESCE(:duration_s, duration_s), fps = COALESCE(:fps, fps),
                       width = COALESCE(:width, width), height = COALESCE(:height, height),
                       uploader = COALESCE(:uploader, uploader), upload_date = COALESCE(:upload_date, upload_date),
                       tags = COALESCE(CAST(:tags AS jsonb), tags), updated_at = now()
                 WHERE video_id = :video_id
            """),
            {
                "video_id": video_id,
                "file_path": file_path,
                "tags": json.dumps(list(meta["tags"])) if meta.get("tags") is not None else None,
                **{
                    k: meta.get(k)
                    for k in (
                        "size_bytes",
                        "title",
                        "duration_s",
                        "fps",
                        "width",
                        "height",
                        "uploader",
                        "upload_date",
                    )
                },
            },
        )

    def forget_video_file(self, conn: sa.Connection, video_id: str) -> None:
        conn.execute(
            sa.text(
                f"UPDATE {S}.videos SET file_path = NULL, updated_at = now() WHERE video_id = :v"
            ),
            {"v": video_id},
        )

    def frame_profiles(
        self, video_ids: Iterable[str] | None
    ) -> dict[str, dict[str, tuple[Path, int]]]:
        """{video_id: {profile_id: (absolute frames dir, frame count)}}; None: every video."""
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"""SELECT * FROM {S}.video_frames
                             WHERE CAST(:ids AS text[]) IS NULL OR video_id = ANY(CAST(:ids AS text[]))"""),
                {"ids": None if video_ids is None else list(video_ids)},
            ).all()
        result: dict[str, dict[str, tuple[Path, int]]] = defaultdict(dict)
        for r in rows:
            result[r.video_id][r.profile_id] = (self.paths.absolute(r.frames_dir), r.frame_count)
        return dict(result)

    def record_frames(
        self,
        conn: sa.Connection,
        video_id: str,
        profile_id: str,
        options: dict,
        frames_dir: Path,
        count: int,
    ) -> None:
        """Record a video's frames of one extraction profile. Its backups no longer hold all its
        frames: they are forgotten, so that the backup runs again (rsync copies what is new)
        before any release may delete these frames (db/retention.py)."""
        conn.execute(
            sa.text(f"UPDATE {S}.videos SET backup_dest = NULL WHERE video_id = :v"),
            {"v": video_id},
        )
        conn.execute(
            sa.text(f"""
                INSERT INTO {S}.video_frames (video_id, profile_id, options, frames_dir, frame_count)
                VALUES (:v, :p, CAST(:o AS jsonb), :d, :n)
                ON CONFLICT (video_id, profile_id) DO UPDATE SET options = EXCLUDED.options,
                       frames_dir = EXCLUDED.frames_dir, frame_count = EXCLUDED.frame_count, updated_at = now()
            """),
            {
                "v": video_id,
                "p": profile_id,
                "o": json.dumps(options),
                "d": self.paths.relative(frames_dir),
                "n": count,
            },
        )

    def forget_frames(
        self, conn: sa.Connection, video_id: str, profile_id: str | None = None
    ) -> None:
        conn.execute(
            sa.text(
                f"DELETE FROM {S}.video_frames WHERE video_id = :v AND (CAST(:p AS text) IS NULL OR profile_id = :p)"
            ),
            {"v": video_id, "p": profile_id},
        )

    def record_filter(
        self, conn: sa.Connection, project_id: int, video_id: str, *, total: int, passed: int
    ) -> None:
        conn.execute(
            sa.text(f"""UPDATE {S}.project_videos SET frames_total = :t, frames_passed = :p, updated_at = now()
                         WHERE project_id = :project AND video_id = :v"""),
            {"t": total, "p": passed, "project": project_id, "v": video_id},
        )

    def record_backup(
        self, conn: sa.Connection, video_id: str, destinations: Sequence[str]
    ) -> None:
        conn.execute(
            sa.text(f"""UPDATE {S}.videos SET backup_dest = :d, backed_up_at = now(), updated_at = now()
                         WHERE video_id = :v"""),
            {"d": "\n".join(destinations), "v": video_id},
        )

    def videos_with_passed_frames(self, project_id: int) -> list[str]:
        with self.engine.connect() as c:
            return list(
                c.execute(
                    sa.text(f"""SELECT video_id FROM {S}.project_videos WHERE project_id = :p
                                   AND frames_passed > 0 ORDER BY video_id"""),
                    {"p": project_id},
                ).scalars()
            )

    # --- the per-video chain ----------------------------------------------------------------

    def link_and_queue(
        self, conn: sa.Connection, project: ProjectRow, candidates: Sequence[Candidate]
    ) -> LinkResult:
        """Link the candidates to the project and queue what each video needs next, failed and
        dead items included (a project that links a video again wants it): what the catalog
        stage, `populate` and `add-video` do."""
        linked = self.link_videos(conn, project, candidates)
        if linked.new_links:  # the project reopens, and its later stages read the frames again
            self.refilter_released(conn, project)
        queued = self.advance_videos(conn, [c.video_id for c in candidates], reset_failed=True)
        return dataclasses.replace(linked, queued=queued)

    def advance_videos(
        self, conn: sa.Connection, video_ids: Sequence[str], *, reset_failed: bool = False
    ) -> int:
        """Queue whatever each video needs next, for every project linked to it.

        download missing -> queue it; frames missing, or missing a linked project's extraction
        profile -> (re)queue extraction, or the download first when the video file is gone; frames
        present -> queue each linked project's filter, and a backup when a linked project names a
        destination the frames have not been copied to. With `reset_failed`, failed and dead items
        on the way are queued again (a project (re)linking a video that had failed)."""
        if not video_ids:
            return 0
        state = conn.execute(
            sa.text(f"""
                SELECT v.video_id, v.file_path, v.source_path, v.backup_dest, d.status AS download,
                       f.status AS frames, b.status AS backup
                  FROM {S}.videos v
                  LEFT JOIN {S}.work_items d ON d.stage = '{DOWNLOAD}' AND d.item_key = v.video_id
                  LEFT JOIN {S}.work_items f ON f.stage = '{FRAMES}' AND f.item_key = v.video_id
                  LEFT JOIN {S}.work_items b ON b.stage = '{BACKUP}' AND b.item_key = v.video_id
                 WHERE v.video_id = ANY(CAST(:ids AS text[]))
            """),
            {"ids": list(video_ids)},
        ).all()
        links = conn.execute(
            sa.text(f"""
                SELECT pv.video_id, p.id AS project_id, p.name, p.config -> 'extract' AS extract,
                       p.config -> 'backup' ->> 'dest' AS backup_to, fi.status AS filter
                  FROM {S}.project_videos pv
                  JOIN {S}.projects p ON p.id = pv.project_id
                  LEFT JOIN {S}.work_items fi ON fi.stage = '{FILTER}' AND fi.item_key = p.name || '.' || pv.video_id
                 WHERE pv.video_id = ANY(CAST(:ids AS text[]))
            """),
            {"ids": list(video_ids)},
        ).all()
        profiles = self._profiles_on_disk(conn, video_ids)
        retry = (FAILED, DEAD) if reset_failed else ()
        queue: dict[tuple[str, tuple], list[tuple[str, int | None, str]]] = defaultdict(list)

        links_by_video: dict[str, list] = defaultdict(list)
        for link in links:
            links_by_video[link.video_id].append(link)
        for video in state:
            vid = video.video_id
            needed = {_profile_id(link.extract) for link in links_by_video[vid]}
            missing_profiles = needed - profiles.get(vid, set())
            file_ok = self._file_present(video)
            if video.download is None or video.download in retry:
                queue[(DOWNLOAD, retry)].append((vid, None, vid))
                continue
            if video.download != DONE:
                continue
            if missing_profiles and not file_ok:
                queue[(DOWNLOAD, (DONE,))].append((vid, None, vid))  # files gone: fetch it again
                continue
            if missing_profiles and (video.frames is None or video.frames in (DONE, *retry)):
                queue[(FRAMES, (DONE, *retry))].append((vid, None, vid))
            for link in links_by_video[vid]:
                if _profile_id(link.extract) in profiles.get(vid, set()) and (
                    link.filter is None or link.filter in retry
                ):
                    queue[(FILTER, retry)].append(
                        (project_video_key(link.name, vid), link.project_id, vid)
                    )
            wanted_backups = {link.backup_to for link in links_by_video[vid] if link.backup_to}
            backed_up = set((video.backup_dest or "").splitlines())
            if profiles.get(vid) and not wanted_backups <= backed_up and video.backup != RUNNING:
                queue[(BACKUP, (DONE, *retry))].append((vid, None, vid))
        queued = 0
        for (stage, reset), items in queue.items():
            keys, project_ids, vids = zip(*items, strict=True)
            queued += self.store.enqueue(
                stage,
                keys,
                project_ids=project_ids,
                video_ids=vids,
                reset=reset,
                conn=conn,
                requested=stage in self.requested_stages,
            )
        return queued

    def filtered_without_frames(self, conn: sa.Connection, project: ProjectRow) -> list[str]:
        """The project's videos whose filter is done but whose frames (of its extraction
        profile) are gone: released after a backup or a cleanup, or deleted by hand."""
        filtered = list(
            conn.execute(
                sa.text(f"""SELECT pv.video_id FROM {S}.project_videos pv
                              JOIN {S}.work_items fi ON fi.stage = '{FILTER}'
                               AND fi.item_key = :name || '.' || pv.video_id
                             WHERE pv.project_id = :p AND fi.status = '{DONE}'
                             ORDER BY pv.id"""),
                {"p": project.id, "name": project.name},
            ).scalars()
        )
        profile = project.config.extract.options().profile_id()
        present = self._profiles_on_disk(conn, filtered)
        return [v for v in filtered if profile not in present.get(v, set())]

    def refilter_released(self, conn: sa.Connection, project: ProjectRow) -> list[str]:
        """Drop the project's filter items of `filtered_without_frames` and queue their frames
        again (their download first if the file is gone): the project waits for them to be
        extracted and filtered anew before its dedup and detection read them. Returns them."""
        released = self.filtered_without_frames(conn, project)
        conn.execute(
            sa.text(f"""DELETE FROM {S}.work_items WHERE project_id = :p AND stage = '{FILTER}'
                           AND video_id = ANY(CAST(:ids AS text[]))"""),
            {"p": project.id, "ids": released},
        )
        self.advance_videos(conn, released)
        return released

    def _profiles_on_disk(
        self, conn: sa.Connection, video_ids: Sequence[str]
    ) -> dict[str, set[str]]:
        rows = conn.execute(
            sa.text(
                f"SELECT video_id, profile_id, frames_dir FROM {S}.video_frames WHERE video_id = ANY(CAST(:ids AS text[]))"
            ),
            {"ids": list(video_ids)},
        ).all()
        present: dict[str, set[str]] = defaultdict(set)
        for r in rows:
            if self.paths.absolute(r.frames_dir).is_dir():
                present[r.video_id].add(r.profile_id)
        return present

    def _file_present(self, video: sa.Row) -> bool:
        stored = video.file_path or video.source_path
        return bool(stored) and self.paths.absolute(stored).is_file()

    def block_project_videos(
        self, conn: sa.Connection, video_id: str, reasons: dict[str, str]
    ) -> None:
        """Record that some projects' rules reject a video (the others go on with it)."""
        for project_name, reason in reasons.items():
            project = conn.execute(
                sa.text(f"SELECT id FROM {S}.projects WHERE name = :n"), {"n": project_name}
            ).scalar()
            self.store.mark(
                FILTER,
                project_video_key(project_name, video_id),
                BLOCKED,
                reason,
                project_id=project,
                video_id=video_id,
                conn=conn,
            )


def _profile_id(extract: dict | None) -> str:
    from dataminer_dagster.assets.frames.config import ExtractConfig

    return ExtractConfig.model_validate(extract or {}).options().profile_id()
