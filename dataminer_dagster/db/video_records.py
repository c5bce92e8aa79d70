"""The videos table and the project-video links: adding and linking videos, recording a
video's file and facts, and the projects each video serves."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_records import ProjectRecords, ProjectRow, reading
from dataminer_dagster.db.schema import BLOCKED, LINKED_THROUGH_COPY, SCHEMA
from dataminer_dagster.registry import FILTER, project_video_key

S = SCHEMA
_CONTENT_LOCKS = 0x68617368  # advisory lock namespace 'hash' (db/host_pauses.py has the others)


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
    content_hash: str | None = None
    same_as: str | None = None  # the original, when this video is a copy of it


@dataclass(frozen=True)
class LinkResult:
    new_videos: int
    new_links: int
    already_linked: int
    queued: int = 0  # work items queued by `link_and_queue`


class VideoRecords:
    """The catalog's videos and their links to projects (`Catalog.videos`), reading the projects
    they link to from `projects`."""

    def __init__(self, engine: sa.Engine, store: LeaseStore, projects: ProjectRecords):
        self.engine = engine
        self.store = store
        self.projects = projects

    def link(
        self, conn: sa.Connection, project: ProjectRow, candidates: Sequence[Candidate]
    ) -> LinkResult:
        """Add unseen videos and link all candidates to the project (idempotent)."""
        if not candidates:
            return LinkResult(0, 0, 0)
        first: dict[str, Candidate] = {}
        for c in candidates:  # one row per video: an upsert may not touch a row twice
            first.setdefault(c.video_id, c)
        candidates = list(first.values())
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
        # cannot deadlock. The originals of copies among them too: advance_videos links the
        # project to those.
        # (A UNION, not `= ANY(...) OR IN (subquery)`, which PostgreSQL plans as a scan of every
        # video: linking then cost what the catalog holds, a minute a batch at 500,000 videos.)
        conn.execute(
            sa.text(f"""SELECT 1 FROM {S}.videos
                         WHERE video_id IN (SELECT unnest(CAST(:ids AS text[]))
                                            UNION
                                            SELECT same_as FROM {S}.videos
                                             WHERE video_id = ANY(CAST(:ids AS text[]))
                                               AND same_as IS NOT NULL)
                         ORDER BY video_id FOR KEY SHARE"""),
            {"ids": [c.video_id for c in candidates]},
        )
        # A link the catalog made through a copy becomes the project's own when it names the
        # video itself.
        new_links = conn.execute(
            sa.text(f"""
                INSERT INTO {S}.project_videos AS pv (project_id, video_id, source, source_info)
                SELECT :project, * FROM unnest(CAST(:ids AS text[]), CAST(:sources AS text[]), CAST(:infos AS text[]))
                ON CONFLICT (project_id, video_id) DO UPDATE
                   SET source = EXCLUDED.source, source_info = EXCLUDED.source_info, updated_at = now()
                 WHERE pv.source = '{LINKED_THROUGH_COPY}'
                RETURNING video_id
            """),
            {
                "project": project.id,
                "ids": [c.video_id for c in candidates],
                "sources": [c.source for c in candidates],
                "infos": [c.source_info for c in candidates],
            },
        ).all()
        return LinkResult(len(new_videos), len(new_links), len(candidates) - len(new_links))

    def get(self, video_ids: Iterable[str]) -> dict[str, VideoRow]:
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
                content_hash=r.content_hash,
                same_as=r.same_as,
            )
            for r in rows
        }

    def project_sources(
        self, project_id: int, video_ids: Iterable[str]
    ) -> dict[str, list[tuple[str | None, str | None]]]:
        """Where a project found each of these videos: (url, source path) of its link to the
        video and of its links to copies of it, in the order it linked them. The catalog's own
        links (to an original, through a copy) are not sources."""
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"""SELECT coalesce(v.same_as, v.video_id) AS video_id, v.url, v.source_path
                              FROM {S}.project_videos pv JOIN {S}.videos v ON v.video_id = pv.video_id
                             WHERE pv.project_id = :p AND pv.source <> '{LINKED_THROUGH_COPY}'
                               AND coalesce(v.same_as, v.video_id) = ANY(CAST(:ids AS text[]))
                             ORDER BY pv.id"""),
                {"p": project_id, "ids": list(video_ids)},
            ).all()
        result: dict[str, list[tuple[str | None, str | None]]] = defaultdict(list)
        for r in rows:
            result[r.video_id].append((r.url, r.source_path))
        return dict(result)

    def project_copies(self, project_id: int) -> list[sa.Row]:
        """The project's videos that are copies of another (video_id, same_as, url, source_path,
        and the original's url and source_path), in the order it linked them. Read from the
        copies (a partial index), not from the project's videos (issue 25)."""
        with self.engine.connect() as c:
            return c.execute(
                sa.text(f"""SELECT v.video_id, v.same_as, v.url, v.source_path,
                                   o.url AS original_url, o.source_path AS original_path
                              FROM {S}.project_videos pv JOIN {S}.videos v ON v.video_id = pv.video_id
                              JOIN {S}.videos o ON o.video_id = v.same_as
                             WHERE pv.project_id = :p AND v.same_as IS NOT NULL
                             ORDER BY pv.id"""),
                {"p": project_id},
            ).all()

    def linked_projects(
        self, video_ids: Iterable[str], conn: sa.Connection | None = None
    ) -> dict[str, list[ProjectRow]]:
        """The projects each video is linked to; read in `conn`'s transaction when given."""
        with reading(self.engine, conn) as c:
            links = c.execute(
                sa.text(f"""SELECT pv.video_id, p.name FROM {S}.project_videos pv JOIN {S}.projects p
                            ON p.id = pv.project_id WHERE pv.video_id = ANY(CAST(:ids AS text[]))
                            ORDER BY p.name"""),
                {"ids": list(video_ids)},
            ).all()
        projects = {
            p.name: p
            for p in self.projects.select(
                "WHERE name = ANY(CAST(:n AS text[]))", {"n": [r.name for r in links]}, conn
            )
        }
        result: dict[str, list[ProjectRow]] = defaultdict(list)
        for r in links:
            result[r.video_id].append(projects[r.name])
        return dict(result)

    def record_file(
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

    def original_for(
        self, video_id: str, content_hash: str, conn: sa.Connection | None = None
    ) -> str | None:
        """The original that the video becomes a copy of when `content_hash` is recorded for it
        (record_content), or None. A video becomes a copy only when its first hash is recorded,
        and only before any frames of its own exist; its original is the earliest video with
        that content that is no copy itself."""
        with reading(self.engine, conn) as c:
            return c.execute(
                sa.text(f"""
                    SELECT o.video_id FROM {S}.videos v JOIN {S}.videos o
                        ON o.content_hash = :h AND o.same_as IS NULL AND o.video_id <> v.video_id
                     WHERE v.video_id = :v AND v.content_hash IS NULL AND NOT EXISTS
                           (SELECT 1 FROM {S}.video_frames f WHERE f.video_id = v.video_id)
                     ORDER BY o.id LIMIT 1
                """),
                {"h": content_hash, "v": video_id},
            ).scalar()

    def record_content(self, conn: sa.Connection, video_id: str, content_hash: str) -> str | None:
        """Record the video's content hash (the first one recorded is kept) and make the video a
        copy of its `original_for`; returns that original, or None.

        Videos of one content are serialised by an advisory lock on the hash, so two copies
        downloaded at once never both become originals. The video's row and the original's are
        locked in id order, as a release of frames locks them (db/retention.py): a project
        linking the video meanwhile waits, then finds it a copy; an original deleted meanwhile
        is not chosen."""
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(:space, hashtext(:h))"),
            {"space": _CONTENT_LOCKS, "h": content_hash},
        )
        original = self.original_for(video_id, content_hash, conn)
        locked = conn.execute(
            sa.text(f"""SELECT video_id FROM {S}.videos WHERE video_id = ANY(CAST(:ids AS text[]))
                         ORDER BY video_id FOR UPDATE"""),
            {"ids": [video_id] + ([original] if original else [])},
        ).scalars()
        if original not in set(locked):
            original = None
        conn.execute(
            sa.text(f"""UPDATE {S}.videos SET content_hash = coalesce(content_hash, :h),
                               same_as = coalesce(same_as, CAST(:original AS text)), updated_at = now()
                         WHERE video_id = :v"""),
            {"h": content_hash, "v": video_id, "original": original},
        )
        return original

    def forget_file(self, conn: sa.Connection, video_id: str) -> None:
        conn.execute(
            sa.text(
                f"UPDATE {S}.videos SET file_path = NULL, updated_at = now() WHERE video_id = :v"
            ),
            {"v": video_id},
        )

    def block_for_projects(
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
