"""The catalog: projects, videos and their links, frames (`Catalog` holds their records:
db/project_records.py, db/video_records.py, db/frame_records.py), and the rule that decides each
video's next work item.

`advance_videos` is the one place that knows the per-video chain (download -> frames -> each linked
project's filter). It derives the next work from the current state, so it is idempotent and can be
called after any change: new links, a finished download or extraction, files that went missing.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.db.frame_records import FrameRecords
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_records import ProjectRecords, ProjectRow
from dataminer_dagster.db.schema import (
    BLOCKED,
    DEAD,
    DONE,
    FAILED,
    INPUT_REDONE,
    LINKED_THROUGH_COPY,
    RUNNING,
    SCHEMA,
    project_video_key_sql,
    stale_sql,
)
from dataminer_dagster.db.video_records import LinkResult, VideoRecords
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.registry import (
    BACKUP,
    DOWNLOAD,
    FILTER,
    FRAMES,
    project_video_key,
)

S = SCHEMA


class Catalog:
    """Projects, videos, links and frames (`projects`, `videos`, `frames`), and the per-video
    chain."""

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
        self.projects = ProjectRecords(engine, store, paths, self.advance_videos)
        self.videos = VideoRecords(engine, store, self.projects)
        self.frames = FrameRecords(engine, paths)

    def link_and_queue(
        self, conn: sa.Connection, project: ProjectRow, candidates: Sequence[Candidate]
    ) -> LinkResult:
        """Link the candidates to the project and queue what each video needs next, failed and
        dead items included (a project that links a video again wants it): what the catalog
        stage, `populate` and `add-video` do."""
        linked = self.videos.link(conn, project, candidates)
        if linked.new_links:  # the project reopens, and its later stages read the frames again
            self.refilter_released(conn, project)
        queued = self.advance_videos(conn, [c.video_id for c in candidates], reset_failed=True)
        return dataclasses.replace(linked, queued=queued)

    def advance_videos(
        self, conn: sa.Connection, video_ids: Sequence[str], *, reset_failed: bool = False
    ) -> int:
        """Queue whatever each video needs next, for every project linked to it.

        download missing -> queue it; the video a copy of another (`same_as`) -> it is processed
        as its original (`_as_originals`); frames missing, or missing a linked project's
        extraction profile -> (re)queue extraction, or the download first when the video file is
        gone; frames present -> queue each linked project's filter (again when it was done or died
        under an earlier config of the project: stale), and a backup when a linked project names
        a destination the frames have not been copied to. With `reset_failed`,
        failed and dead items on the way are queued again (a project (re)linking a video that had
        failed)."""
        if not video_ids:
            return 0
        state = conn.execute(
            sa.text(f"""
                SELECT v.video_id, v.file_path, v.source_path, v.backup_dest, v.same_as,
                       d.status AS download, f.status AS frames, f.outcome ->> 'same_as' AS frames_as,
                       b.status AS backup
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
                       p.config -> 'backup' ->> 'dest' AS backup_to, fi.status AS filter,
                       fi.outcome ->> 'same_as' AS filter_as,
                       {stale_sql("fi", "p.fingerprints ->> fi.stage")} AS filter_stale
                  FROM {S}.project_videos pv
                  JOIN {S}.projects p ON p.id = pv.project_id
                  LEFT JOIN {S}.work_items fi ON fi.stage = '{FILTER}' AND fi.item_key = {project_video_key_sql("p.name", "pv.video_id")}
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
        copies = []
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
            if video.same_as:
                copies.append(video)
                continue
            self._forget_copy_marks(conn, vid, links_by_video[vid])
            if missing_profiles and not file_ok:
                queue[(DOWNLOAD, (DONE,))].append((vid, None, vid))  # files gone: fetch it again
                continue
            if missing_profiles and (video.frames is None or video.frames in (DONE, *retry)):
                queue[(FRAMES, (DONE, *retry))].append((vid, None, vid))
            for link in links_by_video[vid]:
                if _profile_id(link.extract) not in profiles.get(vid, set()):
                    continue
                if link.filter is None or link.filter in retry:
                    queue[(FILTER, retry)].append(
                        (project_video_key(link.name, vid), link.project_id, vid)
                    )
                elif link.filter_stale and link.filter in (DONE, DEAD):
                    queue[(FILTER, (DONE, DEAD))].append(
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
        return queued + self._as_originals(conn, copies, links_by_video, reset_failed)

    def _as_originals(
        self,
        conn: sa.Connection,
        copies: Sequence[sa.Row],
        links_by_video: dict,
        reset_failed: bool,
    ) -> int:
        """A copy's chain ends at its download. Its frames item and each linked project's filter
        item are marked done with the original's id as their outcome's `same_as`, and each of
        those projects is linked to the original (source `copy`), whose frames and filter results
        it uses: the content is extracted once and filtered once per project. A project whose
        rules rejected the copy (its filter item blocked) is not linked. Then the originals are
        advanced."""
        if not copies:
            return 0
        through: list[tuple[int, str, str]] = []  # (project, original, copy)
        for copy in copies:
            vid, original = copy.video_id, copy.same_as
            mark = {"same_as": original}
            note = f"same content as video {original}: processed as that video"
            if copy.frames_as != original and copy.frames != RUNNING:
                self.store.mark(FRAMES, vid, DONE, note, video_id=vid, outcome=mark, conn=conn)
            for link in links_by_video[vid]:
                if link.filter == BLOCKED:
                    continue
                if link.filter_as != original and link.filter != RUNNING:
                    self.store.mark(
                        FILTER,
                        project_video_key(link.name, vid),
                        DONE,
                        note,
                        project_id=link.project_id,
                        video_id=vid,
                        outcome=mark,
                        conn=conn,
                    )
                through.append((link.project_id, original, vid))
        if through:
            projects, originals, via = zip(*through, strict=True)
            conn.execute(
                sa.text(f"""
                    INSERT INTO {S}.project_videos (project_id, video_id, source, source_info)
                    SELECT p, v, '{LINKED_THROUGH_COPY}', c
                      FROM unnest(CAST(:projects AS int[]), CAST(:originals AS text[]),
                                  CAST(:copies AS text[])) AS t(p, v, c)
                    ON CONFLICT (project_id, video_id) DO NOTHING
                """),
                {"projects": list(projects), "originals": list(originals), "copies": list(via)},
            )
        originals = sorted({copy.same_as for copy in copies})
        return self.advance_videos(conn, originals, reset_failed=reset_failed)

    def _forget_copy_marks(self, conn: sa.Connection, video_id: str, links: Sequence) -> None:
        """A video marked as a copy that is an original again (its original was deleted) has its
        projects' filter marks dropped: it is extracted and filtered as any other video."""
        if any(link.filter_as for link in links):
            conn.execute(
                sa.text(f"""DELETE FROM {S}.work_items WHERE stage = '{FILTER}' AND video_id = :v
                               AND status = '{DONE}' AND outcome ? 'same_as'"""),
                {"v": video_id},
            )

    def refilter_new_frames(self, conn: sa.Connection, video_id: str, profiles: set[str]) -> None:
        """Frames of these profiles were extracted (again): the filter items of the projects that
        read them, finished from the frames before, are stale (`advance_videos` queues them)."""
        readers = [
            p.id
            for p in self.videos.linked_projects([video_id], conn).get(video_id, [])
            if p.config.extract.options().profile_id() in profiles
        ]
        conn.execute(
            sa.text(f"""UPDATE {S}.work_items SET fingerprint = '{INPUT_REDONE}'
                         WHERE stage = '{FILTER}' AND video_id = :v
                           AND project_id = ANY(CAST(:projects AS int[]))
                           AND status IN ('{DONE}', '{DEAD}')
                           AND NOT coalesce(outcome ? 'same_as', false)"""),
            {"v": video_id, "projects": readers},
        )

    def filtered_without_frames(self, conn: sa.Connection, project: ProjectRow) -> list[str]:
        """The project's videos whose filter is done but whose frames (of its extraction
        profile) are gone: released after a backup or a cleanup, or deleted by hand. Copies,
        whose filter is their original's, are not among them."""
        filtered = list(
            conn.execute(
                sa.text(f"""SELECT pv.video_id FROM {S}.project_videos pv
                              JOIN {S}.work_items fi ON fi.stage = '{FILTER}'
                               AND fi.item_key = {project_video_key_sql(":name", "pv.video_id")}
                             WHERE pv.project_id = :p AND fi.status = '{DONE}'
                               AND NOT coalesce(fi.outcome ? 'same_as', false)
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


def _profile_id(extract: dict | None) -> str:
    from dataminer_dagster.assets.frames.config import ExtractConfig

    return ExtractConfig.model_validate(extract or {}).options().profile_id()
