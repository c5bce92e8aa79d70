"""Releasing raw frames (db/retention.py): never before a named backup is verified, in one step on
disk that a rollback undoes, and never under a project that is linking the video meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from dataminer_dagster.acquisition.video_ids import Candidate
from dataminer_dagster.assets.backup.store import record_backup
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.file_changes import committing
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_records import ProjectRow
from dataminer_dagster.db.retention import release_finished_frames
from dataminer_dagster.paths import DataPaths
from tests.helpers.pipeline import work_items


@pytest.fixture
def catalog(engine, tmp_path) -> Catalog:
    return Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))


def _project(catalog: Catalog, name: str, tmp_path: Path, **sections) -> ProjectRow:
    config = parse_project_config(
        {
            "name": name,
            "output_dir": str(tmp_path / "out" / name),
            "inputs": {"urls": ["https://example.com/placeholder.mp4"]},
            "filter": {"positive_prompts": ["a thing"]},
            **sections,
        }
    )
    return catalog.projects.register(config).project


def _link(catalog: Catalog, conn: sa.Connection, project: ProjectRow, video_id: str) -> None:
    candidate = Candidate(video_id, "url", url=f"https://example.com/{video_id}.mp4")
    catalog.videos.link(conn, project, [candidate])
    catalog.advance_videos(conn, [video_id])


def _extracted(catalog: Catalog, project: ProjectRow, video_id: str) -> Path:
    """The video linked to the project, its frames on disk and recorded, the project complete."""
    profile = project.config.extract.options().profile_id()
    frames = catalog.paths.frames_dir(video_id, profile)
    frames.mkdir(parents=True)
    (frames / "000001.jpg").write_bytes(b"a frame")
    with catalog.engine.begin() as conn:
        _link(catalog, conn, project, video_id)
        catalog.frames.record(conn, video_id, profile, {}, frames, 1)
        conn.execute(
            sa.text("UPDATE dataminer.projects SET stage = 'complete' WHERE id = :p"),
            {"p": project.id},
        )
    return frames


def _release(catalog: Catalog, video_id: str) -> list[str]:
    with committing(catalog.engine) as conn:
        released = release_finished_frames(catalog, conn, [video_id])
        assert all(path.is_dir() for path in released.aside), "set aside until the commit"
    assert not any(path.exists() for path in released.aside), "deleted once it committed"
    return released.videos


@pytest.mark.parametrize(
    "cleanup, backup",
    [
        ({"delete_frames_when_done": True}, {}),
        ({}, {"delete_after_backup": True}),
    ],
    ids=["cleanup", "delete_after_backup"],
)
def test_frames_with_a_named_backup_go_only_once_it_is_verified(catalog, tmp_path, cleanup, backup):
    dest = str(tmp_path / "backup")
    project = _project(catalog, "alpha", tmp_path, cleanup=cleanup, backup={"dest": dest, **backup})
    frames = _extracted(catalog, project, "v0")

    assert _release(catalog, "v0") == [], "not backed up yet"
    assert frames.is_dir() and catalog.frames.profiles(["v0"])

    with catalog.engine.begin() as conn:
        record_backup(conn, "v0", [str(tmp_path / "elsewhere")])
    assert _release(catalog, "v0") == [], "backed up, but not to this project's destination"

    with catalog.engine.begin() as conn:
        record_backup(conn, "v0", [dest])
    assert _release(catalog, "v0") == ["v0"]
    assert not frames.exists() and catalog.frames.profiles(["v0"]) == {}
    assert list(frames.parent.iterdir()) == [], "nothing left aside"


def test_a_release_rolled_back_puts_the_frames_back(catalog, tmp_path):
    project = _project(catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True})
    frames = _extracted(catalog, project, "v0")
    with pytest.raises(RuntimeError, match="rolled back"), committing(catalog.engine) as conn:
        assert release_finished_frames(catalog, conn, ["v0"]).videos == ["v0"]
        assert not frames.exists(), "moved out of its place at once"
        raise RuntimeError("rolled back")
    assert (frames / "000001.jpg").read_bytes() == b"a frame"
    assert list(frames.parent.iterdir()) == [frames]
    assert catalog.frames.profiles(["v0"]) == {"v0": {frames.name: (frames, 1)}}


def test_a_project_linking_the_video_during_a_release_waits_for_it(catalog, tmp_path):
    alpha = _project(catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True})
    frames = _extracted(catalog, alpha, "v0")
    beta = _project(catalog, "beta", tmp_path)
    linked = threading.Event()

    def link_beta() -> None:
        with catalog.engine.begin() as conn:
            _link(catalog, conn, beta, "v0")
        linked.set()

    with committing(catalog.engine) as conn:
        assert release_finished_frames(catalog, conn, ["v0"]).videos == ["v0"]
        linker = threading.Thread(target=link_beta)
        linker.start()
        assert not linked.wait(1.0), "the link waits for the release to commit"
    linker.join(10)
    assert linked.is_set() and not frames.exists()
    assert [p.name for p in catalog.videos.linked_projects(["v0"])["v0"]] == ["alpha", "beta"]

    # Linked first, beta (not complete) keeps the frames of a video it shares.
    _extracted(catalog, alpha, "v1")
    with catalog.engine.begin() as conn:
        _link(catalog, conn, beta, "v1")
    assert _release(catalog, "v1") == []


def test_a_project_reopened_by_new_videos_filters_its_released_ones_again(catalog, tmp_path):
    """Its dedup and detection run again and read the frames: the members whose frames went
    are extracted and filtered anew first, not read from files that are gone."""
    alpha = _project(catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True})
    _extracted(catalog, alpha, "v0")
    catalog.store.enqueue("filter", ["alpha.v0"], project_ids=[alpha.id], video_ids=["v0"])
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("UPDATE dataminer.work_items SET status = 'done'"))
    assert _release(catalog, "v0") == ["v0"]

    def link(*video_ids: str) -> None:
        candidates = [Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in video_ids]
        with catalog.engine.begin() as conn:
            catalog.link_and_queue(conn, alpha, candidates)

    link("v0")  # found again, nothing new: the finished project stays as it is
    assert work_items(catalog.engine, "filter")["alpha.v0"].status == "done"

    link("v0", "v1")
    assert "alpha.v0" not in work_items(catalog.engine, "filter")
    assert work_items(catalog.engine, "download")["v0"].status == "pending", (
        "v0 is fetched (its file is not on disk) and extracted again"
    )


def test_linking_and_releasing_the_same_videos_at_once_do_not_deadlock(catalog, tmp_path):
    """A link's foreign keys lock the video rows in discovery order, a release in id order. A
    trigger holds the link between its two rows' checks while the release locks both."""
    alpha = _project(catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True})
    for video_id in ("v0", "v1"):
        _extracted(catalog, alpha, video_id)
    beta = _project(catalog, "beta", tmp_path)
    with catalog.engine.begin() as conn:  # runs before the foreign key checks ("RI_...")
        conn.execute(
            sa.text("""CREATE FUNCTION dataminer.pause_at_v0() RETURNS trigger AS $$
                       BEGIN IF NEW.video_id = 'v0' THEN PERFORM pg_sleep(1.5); END IF;
                       RETURN NULL; END $$ LANGUAGE plpgsql;
                       CREATE TRIGGER "A_pause" AFTER INSERT ON dataminer.project_videos
                       FOR EACH ROW EXECUTE FUNCTION dataminer.pause_at_v0()""")
        )
    errors: list[BaseException] = []

    def link_beta() -> None:  # v1 first, as a search may find them
        try:
            candidates = [
                Candidate(v, "url", url=f"https://example.com/{v}.mp4") for v in ("v1", "v0")
            ]
            with catalog.engine.begin() as conn:
                catalog.videos.link(conn, beta, candidates)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    linker = threading.Thread(target=link_beta)
    linker.start()
    time.sleep(0.5)  # the link is paused at v0, its check of v1 done
    try:
        with committing(catalog.engine) as conn:
            released = release_finished_frames(catalog, conn, ["v0", "v1"]).videos
    except sa.exc.OperationalError as error:
        released = error
    linker.join(30)
    assert not errors and released == [], (errors, released)  # beta uses them now
    assert [p.name for p in catalog.videos.linked_projects(["v0"])["v0"]] == ["alpha", "beta"]


def test_frames_extracted_after_the_backup_are_backed_up_before_they_may_go(catalog, tmp_path):
    """Another project's extraction profile comes after the backup: the recorded backup no
    longer holds every frame of the video, so it runs again before any release."""
    dest = str(tmp_path / "backup")
    alpha = _project(
        catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True}, backup={"dest": dest}
    )
    _extracted(catalog, alpha, "v0")
    with catalog.engine.begin() as conn:
        record_backup(conn, "v0", [dest])
        other = catalog.paths.frames_dir("v0", "another-profile")
        other.mkdir(parents=True)
        catalog.frames.record(conn, "v0", "another-profile", {}, other, 1)
    assert _release(catalog, "v0") == [], "the new frames are in no backup yet"
    assert other.is_dir()
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("UPDATE dataminer.work_items SET status = 'done'"))  # downloaded
        catalog.advance_videos(conn, ["v0"])
    assert work_items(catalog.engine, "backup")["v0"].status == "pending"


# --- a completion whose COMMIT fails ----------------------------------------------------------


def _refuse_completions_at_commit(engine: sa.Engine, body: str) -> None:
    """A deferred constraint trigger: `body` (PL/pgSQL) runs at COMMIT of a transaction that
    marked a work item done."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"""
            CREATE FUNCTION dataminer.at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN {body} RETURN NULL; END $$;
            CREATE CONSTRAINT TRIGGER at_commit AFTER UPDATE ON dataminer.work_items
              DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.status = 'done')
              EXECUTE FUNCTION dataminer.at_commit();
        """)


def _claimed_backup(catalog: Catalog, video_id: str):
    store = catalog.store
    store.enqueue("backup", [video_id], video_ids=[video_id])
    [lease] = store.claim_next("backup", "run-1")
    return lease


@pytest.mark.parametrize(
    "at_commit, error",
    [
        ("RAISE EXCEPTION 'refused at commit';", sa.exc.DBAPIError),
        # The backend ends during COMMIT: the client only sees its connection lost, and reads the
        # outcome back by the lease's token.
        ("PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);", sa.exc.DBAPIError),
    ],
    ids=["deferred-constraint", "backend-terminated"],
)
def test_frames_released_by_a_completion_whose_commit_fails_go_back(
    catalog, tmp_path, at_commit, error
):
    project = _project(catalog, "alpha", tmp_path, cleanup={"delete_frames_when_done": True})
    frames = _extracted(catalog, project, "v0")
    lease = _claimed_backup(catalog, "v0")
    _refuse_completions_at_commit(catalog.engine, at_commit)

    with pytest.raises(error), catalog.store.completing(lease) as conn:
        assert release_finished_frames(catalog, conn, ["v0"]).videos == ["v0"]
        assert not frames.exists()
    assert (frames / "000001.jpg").read_bytes() == b"a frame", "put back: nothing committed"
    assert list(frames.parent.iterdir()) == [frames], "nothing left aside"
    assert catalog.frames.profiles(["v0"]) == {"v0": {frames.name: (frames, 1)}}
    backup = work_items(catalog.engine, "backup")["v0"]
    assert (backup.status, backup.lease_token) == ("running", lease.token), "still the holder's"
