"""Projects move from stage to stage on what changed (issue 25): the database's triggers note, in
the transaction of each change, which projects it touched (migration 0011), and
`advance_projects` reads only those. A quiet call reads the notes and nothing else; a change
committed while a call runs, or left by a call that failed, is acted on by the next call."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dataminer_dagster.db import migrate, project_flow
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_flow import advance_projects
from dataminer_dagster.db.scheduling import mark_requested
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.registry import project_video_key
from tests.helpers.catalog_seed import add_project, seed_videos
from tests.helpers.statements import statements_sent

S = "dataminer"
VIDEOS = 20


@pytest.fixture
def store(engine) -> LeaseStore:
    return LeaseStore(engine)


@pytest.fixture
def project(engine, store, tmp_path) -> int:
    """A project whose catalog is done and whose videos are downloaded and extracted, each
    waiting for its filter: one filter done short of moving on to dedup."""
    project_id = add_project(Catalog(engine, store, DataPaths(tmp_path / "data")), "birds")
    seed_videos(engine, project_id, VIDEOS, "b")
    with engine.begin() as c:
        c.execute(sa.text(f"UPDATE {S}.work_items SET status = 'done' WHERE stage = 'catalog'"))
        c.execute(
            sa.text(f"""UPDATE {S}.work_items SET status = 'done'
                         WHERE stage = 'filter' AND item_key <> :last"""),
            {"last": project_video_key("birds", f"b{VIDEOS}")},
        )
    assert advance_projects(store) == []  # the last filter is pending
    return project_id


def finish_last_filter(conn: sa.Connection) -> None:
    conn.execute(
        sa.text(f"UPDATE {S}.work_items SET status = 'done' WHERE item_key = :last"),
        {"last": project_video_key("birds", f"b{VIDEOS}")},
    )


def notes(engine: sa.Engine) -> list[int]:
    with engine.connect() as c:
        return sorted(c.execute(sa.text(f"SELECT project_id FROM {S}.project_changes")).scalars())


def stage_of(engine: sa.Engine, project_id: int) -> str:
    with engine.connect() as c:
        return c.execute(
            sa.text(f"SELECT stage FROM {S}.projects WHERE id = :p"), {"p": project_id}
        ).scalar_one()


def test_a_call_with_nothing_changed_reads_the_notes_and_nothing_else(engine, store, project):
    sent = statements_sent(engine, lambda: advance_projects(store))
    assert len(sent) == 1 and "project_changes" in sent[0][0], sent


def test_the_last_member_finishing_moves_the_project_on(engine, store, project):
    with engine.begin() as c:
        finish_last_filter(c)
    assert notes(engine) == [project]
    moved = advance_projects(store)
    assert [(t.old, t.new) for t in moved] == [("active", "dedup")]
    assert moved[0].reason == f"all {VIDEOS} member videos finished"
    assert stage_of(engine, project) == "dedup"


def test_a_change_committed_while_a_call_runs_is_acted_on_by_the_next_call(engine, store, project):
    with engine.connect() as writer, writer.begin():
        finish_last_filter(writer)
        assert advance_projects(store) == []  # the change is not committed yet
        # committed now, after the call read the notes: its note is still there
    assert [t.new for t in advance_projects(store)] == ["dedup"]


def test_a_call_that_fails_leaves_its_notes_to_the_next(engine, store, project, monkeypatch):
    with engine.begin() as c:
        finish_last_filter(c)

    def broken(state):
        raise RuntimeError("the database went away")

    with monkeypatch.context() as patch:
        patch.setattr(project_flow, "_next", broken)
        with pytest.raises(RuntimeError):
            advance_projects(store)
    assert notes(engine) == [project]
    assert [t.new for t in advance_projects(store)] == ["dedup"]


def test_every_project_is_looked_at_hourly_whatever_the_notes_say(
    engine, store, project, monkeypatch
):
    """The safety net for a change whose note missed a project (a link of the video committed
    and acted on before the change itself): its project moves at the next whole look."""
    with engine.begin() as c:
        finish_last_filter(c)
        c.execute(sa.text(f"DELETE FROM {S}.project_changes"))  # as if the note named no one
    assert advance_projects(store) == []
    monkeypatch.setattr(project_flow, "ALL_PROJECTS_EVERY_S", 0.0)
    assert [t.new for t in advance_projects(store)] == ["dedup"]


def test_a_video_items_change_notes_every_project_that_links_the_video(
    engine, store, project, tmp_path
):
    other = add_project(Catalog(engine, store, DataPaths(tmp_path / "data")), "cats")
    with engine.begin() as c:
        c.execute(
            sa.text(f"""INSERT INTO {S}.project_videos (project_id, video_id, source)
                         VALUES (:p, 'b3', 'url')"""),
            {"p": other},
        )
    advance_projects(store)
    with engine.begin() as c:
        c.execute(sa.text(f"UPDATE {S}.work_items SET status = 'dead' WHERE item_key = 'b3'"))
    assert set(notes(engine)) == {project, other}


def test_marking_items_requested_notes_no_project(engine, store, project):
    with engine.connect() as c:
        ids = list(c.execute(sa.text(f"SELECT id FROM {S}.work_items")).scalars())
    mark_requested(engine, ids)
    assert notes(engine) == []


def test_a_reopened_finished_project_is_noted_by_its_new_member(engine, store, project):
    with engine.begin() as c:
        finish_last_filter(c)
    while stage_of(engine, project) != "complete":  # each stage of the chain done in turn
        with engine.begin() as c:
            c.execute(
                sa.text(f"UPDATE {S}.work_items SET status = 'done' WHERE project_id = :p"),
                {"p": project},
            )
        assert advance_projects(store)
    assert stage_of(engine, project) == "complete"
    assert advance_projects(store) == []  # its own move to complete, noted: nothing to do
    assert (
        len(statements_sent(engine, lambda: advance_projects(store))) == 1
    )  # a complete project costs nothing
    with engine.begin() as c:
        c.execute(sa.text(f"INSERT INTO {S}.videos (video_id, url) VALUES ('late', 'u')"))
        c.execute(
            sa.text(f"""INSERT INTO {S}.project_videos (project_id, video_id, source)
                         VALUES (:p, 'late', 'url')"""),
            {"p": project},
        )
    moved = advance_projects(store)
    assert [(t.old, t.new, t.reason) for t in moved] == [
        ("complete", "active", "1 member videos are not finished")
    ]


def test_an_upgraded_database_looks_at_each_project_once(empty_database_url):
    engine = sa.create_engine(empty_database_url, poolclass=sa.NullPool)
    try:
        migrate.upgrade(engine, revision="0010")
        with engine.begin() as c:
            c.execute(
                sa.text(f"""INSERT INTO {S}.projects (name, config, config_hash, output_dir, stage)
                             VALUES ('old', '{{}}', 'h', '/out', 'active')""")
            )
        migrate.upgrade(engine)
        assert len(notes(engine)) == 1
    finally:
        engine.dispose()
