"""The videos table and the project-video links: adding and linking videos, recording a
video's file and facts, and the projects each video serves."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from dataminer_dagster.db.project_records import ProjectRecords, ProjectRow
from dataminer_dagster.db.schema import BLOCKED, SCHEMA
from dataminer_dagster.engine.registry import FILTER, project_video_key

S = SCHEMA


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


class VideoRecords(ProjectRecords):
    """The catalog's videos and their links to projects (a part of `Catalog`)."""

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
