"""The copy of the videos' progress onto their links (db/link_progress.py, migration 0014) beside
the transactions it meets: a change not yet committed keeps its note, a link another transaction
holds is left without waiting (and its video's note with it), two copies never overlap, and an
upgraded database notes every linked video. That the read is exact whatever was copied is
tests/db/test_video_totals.py's."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa

from dataminer_dagster.db import migrate
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.link_progress import _COPY_LOCK, copy_link_progress
from dataminer_dagster.paths import DataPaths
from tests.helpers.catalog_seed import add_project, seed_videos

S = "dataminer"


@pytest.fixture
def project(engine, tmp_path) -> int:
    """Three videos downloaded and extracted, their progress copied onto their links."""
    project_id = add_project(Catalog(engine, LeaseStore(engine), DataPaths(tmp_path)), "birds")
    seed_videos(engine, project_id, 3, "b")
    copy_link_progress(engine)
    assert noted(engine) == []
    return project_id


def noted(engine: sa.Engine) -> list[str]:
    with engine.connect() as c:
        return sorted(
            c.execute(sa.text(f"SELECT DISTINCT video_id FROM {S}.video_changes")).scalars()
        )


def link_status(engine: sa.Engine, video: str) -> str | None:
    with engine.connect() as c:
        return c.execute(
            sa.text(f"SELECT download_status FROM {S}.project_videos WHERE video_id = :v"),
            {"v": video},
        ).scalar_one()


def fail_download(conn: sa.Connection, video: str) -> None:
    conn.execute(
        sa.text(f"""UPDATE {S}.work_items SET status = 'failed'
                     WHERE stage = 'download' AND item_key = :v"""),
        {"v": video},
    )


def test_a_change_not_yet_committed_when_the_copy_runs_keeps_its_note(engine, project):
    with engine.connect() as change:
        with change.begin():
            fail_download(change, "b1")
            assert copy_link_progress(engine) == 0  # the change and its note are not visible
        assert noted(engine) == ["b1"]
        assert link_status(engine, "b1") == "done"
        assert copy_link_progress(engine) == 1
    assert (noted(engine), link_status(engine, "b1")) == ([], "failed")


def test_a_link_another_transaction_holds_is_left_with_its_note_without_waiting(engine, project):
    with engine.begin() as c:
        fail_download(c, "b1")
        fail_download(c, "b2")
    with engine.connect() as holder, holder.begin():
        holder.execute(
            sa.text(f"UPDATE {S}.project_videos SET frames_total = 7 WHERE video_id = 'b1'")
        )
        pool = ThreadPoolExecutor(1)  # a copy that waited would outlast the timeout
        try:
            assert pool.submit(copy_link_progress, engine).result(timeout=30) == 1  # b2's note
        finally:
            pool.shutdown(wait=False)
        assert noted(engine) == ["b1"]
    assert (link_status(engine, "b1"), link_status(engine, "b2")) == ("done", "failed")
    copy_link_progress(engine)
    assert (noted(engine), link_status(engine, "b1")) == ([], "failed")


def test_a_copy_that_finds_another_at_work_leaves_the_notes_to_the_next(engine, project):
    with engine.begin() as c:
        fail_download(c, "b3")
    with engine.connect() as other, other.begin():
        other.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _COPY_LOCK})
        assert copy_link_progress(engine) == 0
        assert noted(engine) == ["b3"]
    assert copy_link_progress(engine) == 1


def test_a_copy_takes_at_most_its_limit_of_notes(engine, project):
    with engine.begin() as c:
        for video in ("b1", "b2", "b3"):
            fail_download(c, video)
    assert copy_link_progress(engine, limit=2) == 2
    assert len(noted(engine)) == 1
    assert copy_link_progress(engine, limit=2) == 1


def test_an_upgraded_database_notes_every_linked_video(empty_database_url):
    engine = sa.create_engine(empty_database_url, poolclass=sa.NullPool)
    try:
        migrate.upgrade(engine, revision="0013")
        with engine.begin() as c:
            c.execute(
                sa.text(f"""INSERT INTO {S}.projects (name, config, config_hash, output_dir, stage)
                             VALUES ('old', '{{}}', 'h', '/out', 'active')""")
            )
            c.execute(
                sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('v1', 'u1'), ('v2', 'u2')")
            )
            c.execute(
                sa.text(f"""INSERT INTO {S}.project_videos (project_id, video_id, source)
                             SELECT id, 'v1', 'url' FROM {S}.projects""")
            )
        migrate.upgrade(engine)
        assert noted(engine) == ["v1"]
        copy_link_progress(engine)
        assert noted(engine) == []
    finally:
        engine.dispose()
