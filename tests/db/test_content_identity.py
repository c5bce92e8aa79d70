"""Content identity in the catalog: a video whose content an earlier video has is a copy of it
(`videos.same_as`), processed as that video, and never the reason the original's frames go."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.deletions import (
    delete_orphan_videos,
    delete_project,
    delete_project_videos,
)
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.schema import DONE
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.registry import DOWNLOAD
from tests.helpers.pipeline import work_items

HASH = "a" * 64


@pytest.fixture
def catalog(engine, tmp_path) -> Catalog:
    return Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))


def _project(catalog: Catalog, name: str, tmp_path: Path) -> ProjectRow:
    config = parse_project_config(
        {
            "name": name,
            "output_dir": str(tmp_path / "out" / name),
            "inputs": {"urls": ["https://example.com/placeholder.mp4"]},
            "filter": {"positive_prompts": ["a thing"]},
        }
    )
    return catalog.projects.register(config).project


def _link(catalog: Catalog, project: ProjectRow, *video_ids: str) -> None:
    with catalog.engine.begin() as conn:
        catalog.link_and_queue(
            conn,
            project,
            [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in video_ids],
        )


def _downloaded(catalog: Catalog, video_id: str, content_hash: str = HASH) -> str | None:
    """What the download stage's commit records: the item done, the content, the file (an
    original's), the next work."""
    file = catalog.paths.videos_dir / f"{video_id}.mp4"
    with catalog.engine.begin() as conn:
        catalog.store.mark(DOWNLOAD, video_id, DONE, "downloaded", video_id=video_id, conn=conn)
        original = catalog.videos.record_content(conn, video_id, content_hash)
        if original is None:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(b"a video")
            catalog.videos.record_file(conn, video_id, catalog.paths.relative(file), {})
        catalog.advance_videos(conn, [video_id])
    return original


def _extracted(catalog: Catalog, project: ProjectRow, video_id: str) -> Path:
    profile = project.config.extract.options().profile_id()
    frames = catalog.paths.frames_dir(video_id, profile)
    frames.mkdir(parents=True)
    (frames / f"{video_id}_000001.jpg").write_bytes(b"a frame")
    with catalog.engine.begin() as conn:
        catalog.store.mark("frames", video_id, DONE, "extracted", video_id=video_id, conn=conn)
        catalog.frames.record(conn, video_id, profile, {}, frames, 1)
        catalog.advance_videos(conn, [video_id])
    return frames


def _links(engine, project: ProjectRow) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as c:
        rows = c.execute(
            sa.text("""SELECT video_id, source, source_info FROM dataminer.project_videos
                        WHERE project_id = :p ORDER BY id"""),
            {"p": project.id},
        ).all()
    return {r.video_id: (r.source, r.source_info) for r in rows}


def test_the_second_video_with_a_content_is_a_copy_of_the_first(catalog, tmp_path):
    project = _project(catalog, "p", tmp_path)
    _link(catalog, project, "original-0000000001", "copy-000000000000002", "other-00000000000003")
    assert _downloaded(catalog, "original-0000000001") is None
    assert _downloaded(catalog, "copy-000000000000002") == "original-0000000001"
    assert _downloaded(catalog, "other-00000000000003", "b" * 64) is None

    videos = catalog.videos.get(["original-0000000001", "copy-000000000000002"])
    assert videos["original-0000000001"].same_as is None
    assert videos["copy-000000000000002"].same_as == "original-0000000001"
    assert videos["copy-000000000000002"].content_hash == HASH
    # The hash recorded first is kept, and a video becomes a copy only when it is first recorded.
    with catalog.engine.begin() as conn:
        assert catalog.videos.record_content(conn, "other-00000000000003", HASH) is None
    assert (
        catalog.videos.get(["other-00000000000003"])["other-00000000000003"].content_hash
        == "b" * 64
    )


def test_a_video_with_frames_of_its_own_is_not_made_a_copy(catalog, tmp_path):
    project = _project(catalog, "p", tmp_path)
    _link(catalog, project, "original-0000000001", "extracted-0000000002")
    _downloaded(catalog, "original-0000000001")
    _extracted(catalog, project, "extracted-0000000002")  # frames from before it was hashed
    assert _downloaded(catalog, "extracted-0000000002") is None


def test_two_copies_recorded_at_once_have_one_original(catalog, tmp_path):
    project = _project(catalog, "p", tmp_path)
    _link(catalog, project, "first-0000000000001", "second-000000000002")
    found: list[str | None] = []
    with catalog.engine.connect() as first, first.begin():
        assert catalog.videos.record_content(first, "first-0000000000001", HASH) is None

        def second() -> None:
            with catalog.engine.begin() as conn:
                found.append(catalog.videos.record_content(conn, "second-000000000002", HASH))

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive(), "the second waits for the first's transaction"
    thread.join(10)
    assert found == ["first-0000000000001"]


def test_a_copy_is_processed_as_its_original(catalog, tmp_path):
    p = _project(catalog, "p", tmp_path)
    q = _project(catalog, "q", tmp_path)
    _link(catalog, p, "original-0000000001")
    _downloaded(catalog, "original-0000000001")
    _extracted(catalog, p, "original-0000000001")
    _link(catalog, q, "copy-000000000000002")
    _downloaded(catalog, "copy-000000000000002")

    # q is linked to the original through the copy; the copy's own items name the original.
    assert _links(catalog.engine, q) == {
        "copy-000000000000002": ("url", None),
        "original-0000000001": ("copy", "copy-000000000000002"),
    }
    frames = work_items(catalog.engine, "frames")
    assert frames["copy-000000000000002"].status == "done"
    assert frames["copy-000000000000002"].outcome["same_as"] == "original-0000000001"
    filters = work_items(catalog.engine, "filter")
    assert filters["q.copy-000000000000002"].status == "done"
    assert filters["q.copy-000000000000002"].outcome["same_as"] == "original-0000000001"
    assert filters["q.original-0000000001"].status == "pending", "q filters the original's frames"
    assert set(filters) == {
        "p.original-0000000001",
        "q.copy-000000000000002",
        "q.original-0000000001",
    }

    # Naming the original itself makes the catalog's link the project's own.
    _link(catalog, q, "original-0000000001")
    assert _links(catalog.engine, q)["original-0000000001"] == ("url", None)
    assert catalog.videos.project_sources(q.id, ["original-0000000001"]) == {
        "original-0000000001": [
            ("https://example.com/copy-000000000000002.mp4", None),
            ("https://example.com/original-0000000001.mp4", None),
        ]
    }
    assert [r.video_id for r in catalog.videos.project_copies(q.id)] == ["copy-000000000000002"]


def test_a_copy_rejected_by_a_projects_rule_links_nothing(catalog, tmp_path):
    p = _project(catalog, "p", tmp_path)
    q = _project(catalog, "q", tmp_path)
    _link(catalog, p, "original-0000000001")
    _downloaded(catalog, "original-0000000001")
    _link(catalog, q, "copy-000000000000002")
    with catalog.engine.begin() as conn:
        catalog.store.mark(
            DOWNLOAD, "copy-000000000000002", DONE, "x", video_id="copy-000000000000002", conn=conn
        )
        catalog.videos.record_content(conn, "copy-000000000000002", HASH)
        catalog.videos.block_for_projects(conn, "copy-000000000000002", {"q": "a blocked hashtag"})
        catalog.advance_videos(conn, ["copy-000000000000002"])
    assert work_items(catalog.engine, "filter")["q.copy-000000000000002"].status == "blocked"
    assert _links(catalog.engine, q) == {"copy-000000000000002": ("url", None)}


def test_the_original_stays_while_a_project_uses_a_copy(catalog, tmp_path):
    p = _project(catalog, "p", tmp_path)
    q = _project(catalog, "q", tmp_path)
    _link(catalog, p, "original-0000000001")
    _downloaded(catalog, "original-0000000001")
    frames = _extracted(catalog, p, "original-0000000001")
    _link(catalog, q, "copy-000000000000002")
    _downloaded(catalog, "copy-000000000000002")
    engine, paths = catalog.engine, catalog.paths

    deleted = delete_project(engine, paths, "p", delete_unused_videos=True)
    assert deleted.deleted_videos == []
    assert delete_orphan_videos(engine, paths, remove_files=True).deleted_videos == []
    assert frames.is_dir()

    # Without the catalog's link, the copy's project still keeps the original.
    with engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM dataminer.project_videos WHERE source = 'copy'"),
        )
    assert delete_orphan_videos(engine, paths, remove_files=True).deleted_videos == []
    assert frames.is_dir()

    # Removing the copy from its project removes it with its original (one video to q), and then
    # both are orphans, deleted with the frames.
    _link(catalog, q, "copy-000000000000002")
    removed = delete_project_videos(engine, paths, "q", "done", delete_unused_videos=True)
    assert sorted(removed.matched) == ["copy-000000000000002", "original-0000000001"]
    assert sorted(removed.deleted_videos) == ["copy-000000000000002", "original-0000000001"]
    assert not frames.exists()


def test_a_copy_whose_original_is_gone_is_processed_as_any_video(catalog, tmp_path):
    p = _project(catalog, "p", tmp_path)
    _link(catalog, p, "original-0000000001", "copy-000000000000002")
    _downloaded(catalog, "original-0000000001")
    _downloaded(catalog, "copy-000000000000002")
    assert work_items(catalog.engine, "filter")["p.copy-000000000000002"].status == "done"

    with catalog.engine.begin() as conn:  # what no deletion does while a project uses the copy
        conn.execute(sa.text("DELETE FROM dataminer.videos WHERE video_id = 'original-0000000001'"))
    assert catalog.videos.get(["copy-000000000000002"])["copy-000000000000002"].same_as is None
    with catalog.engine.begin() as conn:
        catalog.advance_videos(conn, ["copy-000000000000002"])
    assert "p.copy-000000000000002" not in work_items(catalog.engine, "filter")
    # Its downloaded file went when it became a copy: it is downloaded again, then extracted.
    assert work_items(catalog.engine, "download")["copy-000000000000002"].status == "pending"
