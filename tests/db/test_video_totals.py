"""A project's videos read in one pass (db/video_totals.py) give `dataminer status NAME` its work
counts, its yield per source, its frames and its target's budget: the same numbers as the
overview's own count of the work (`stage_counts`, a different statement) and as the videos hold,
with a video shared by two projects, a copy, a video without items and items finished long ago;
whether the videos' progress was read live or from the links it was copied onto
(db/link_progress.py), and after any changes, copied or not."""

from __future__ import annotations

import random

import pytest
import sqlalchemy as sa

from dataminer_dagster.db.acquisition_rounds import spent
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.link_progress import copy_link_progress
from dataminer_dagster.db.reports import project_status, source_yield, stage_counts, work_summary
from dataminer_dagster.db.video_totals import video_totals
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.settings import load_settings
from tests.helpers.catalog_seed import add_project

VIDEOS = {  # video: (duration_s, size_bytes)
    "v1": (600.0, 2_000_000_000),
    "v2": (60.0, 1),
    "v3": (120.0, 500_000_000),
    "v4": (30.0, 7),
    "v5": (None, None),
    "v6": (90.0, 3),
}
LINKS = [  # (project, video, source, source_info, frames total / passed / kept)
    ("a", "v1", "search", "cats", (100, 40, 10)),
    ("a", "v2", "search", "cats", (None, None, None)),
    ("a", "v3", "url", None, (50, 5, 1)),
    ("a", "v4", "copy", "v3", (20, 2, 0)),  # the same content as v3
    ("a", "v5", "url", None, (None, None, None)),  # no item yet
    ("b", "v1", "listing", "feed", (100, 90, 80)),  # shared with a
    ("b", "v6", "listing", "feed", (None, None, None)),
]
ITEMS = [  # (stage, video, status, finished minutes ago)
    ("download", "v1", "done", 1),
    ("download", "v2", "failed", None),
    ("download", "v3", "done", 120),
    ("download", "v4", "done", 2),
    ("download", "v6", "dead", 3),
    ("frames", "v1", "done", 4),
    ("frames", "v3", "pending", None),
]


@pytest.fixture(params=["live", "copied"])
def catalog(engine, tmp_path, request) -> Catalog:
    """The catalog above, its videos' progress read live (every video noted) or, once copied
    onto the links (db/link_progress.py), from the links: the same numbers either way."""
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    ids = {name: add_project(catalog, name) for name in ("a", "b")}
    with engine.begin() as c:
        for video, (duration, size) in VIDEOS.items():
            c.execute(
                sa.text("""INSERT INTO dataminer.videos (video_id, url, duration_s, size_bytes)
                           VALUES (:v, 'https://videos.invalid/' || :v, :d, :s)"""),
                {"v": video, "d": duration, "s": size},
            )
        for project, video, source, info, (total, passed, kept) in LINKS:
            c.execute(
                sa.text("""INSERT INTO dataminer.project_videos (project_id, video_id, source,
                               source_info, frames_total, frames_passed, frames_kept)
                           VALUES (:p, :v, :source, :info, :total, :passed, :kept)"""),
                {"p": ids[project], "v": video, "source": source, "info": info}
                | {"total": total, "passed": passed, "kept": kept},
            )
        for stage, video, status, minutes in ITEMS:
            c.execute(
                sa.text("""INSERT INTO dataminer.work_items
                               (stage, item_key, video_id, status, max_attempts, finished_at)
                           VALUES (:stage, :v, :v, :status, 4,
                                   now() - make_interval(mins => CAST(:minutes AS int)))"""),
                {"stage": stage, "v": video, "status": status, "minutes": minutes},
            )
    if request.param == "copied":
        assert copy_link_progress(engine) > 0
        assert notes(engine) == 0
    return catalog


def notes(engine) -> int:
    with engine.connect() as c:
        return c.execute(sa.text("SELECT count(*) FROM dataminer.video_changes")).scalar()


def nonzero(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {stage: {s: n for s, n in by.items() if n} for stage, by in counts.items()}


def test_the_pass_counts_the_work_as_the_overview_does(catalog):
    a, b = catalog.projects.get("a").id, catalog.projects.get("b").id
    for project in (a, b):
        assert work_summary(catalog.engine, project, 15).counts == stage_counts(
            catalog.engine, project
        )
    summary = work_summary(catalog.engine, a, 15)
    assert nonzero(summary.counts) == {
        "download": {"done": 3, "failed": 1},
        "frames": {"done": 1, "pending": 1},
        "catalog": {"pending": 1},
    }
    assert summary.finished == {"download": 2, "frames": 1}  # v3's download is two hours old
    assert nonzero(work_summary(catalog.engine, b, 15).counts) == {
        "download": {"done": 1, "dead": 1},
        "frames": {"done": 1},
        "catalog": {"pending": 1},
    }


def test_the_yield_and_the_budget_count_each_source_and_leave_the_copies_out(catalog):
    a = catalog.projects.get("a").id
    assert source_yield(catalog.engine, a) == [
        {
            "source": "search: cats",
            "videos": 2,
            "downloaded": 1,
            "downloaded_minutes": 10.0,
            "frames_extracted": 100,
            "frames_passed": 40,
            "frames_kept": 10,
            "kept_per_video": 10.0,
            "kept_per_minute": 1.0,
        },
        {
            "source": "url: None",
            "videos": 2,
            "downloaded": 1,
            "downloaded_minutes": 2.0,
            "frames_extracted": 50,
            "frames_passed": 5,
            "frames_kept": 1,
            "kept_per_video": 1.0,
            "kept_per_minute": 0.5,
        },
    ]
    with catalog.engine.connect() as c:
        used = spent(c, a)
    assert (used.videos, used.downloaded) == (4, 2)
    assert used.hours == pytest.approx(720 / 3600)
    assert used.gigabytes == pytest.approx(2.5)


def test_a_projects_status_counts_its_copies_among_its_videos_and_frames(catalog):
    status = project_status(catalog, catalog.projects.get("a"), 15, load_settings().long_running)
    assert status["videos"] == 5
    assert status["frames"]["extracted"] == 170
    assert status["frames"]["passed_filter"] == 47
    assert [y["source"] for y in status["yield"]] == ["search: cats", "url: None"]
    by_stage = {s["stage"]: s for s in status["stages"]}
    assert (by_stage["download"]["done"], by_stage["download"]["finished_in_window"]) == (3, 2)
    assert by_stage["frames"]["pending"] == 1


def totals(engine, project: int):
    with engine.connect() as c:
        read = video_totals(c, project, ["download", "frames"], 15)
    return (
        sorted(read.sources, key=lambda s: (s.source, s.source_info or "")),
        read.counts,
        read.finished,
    )


def live_totals(engine, project: int):
    """What the pass reads with every video's progress taken live (each video noted, in a
    transaction that is rolled back): the reference of a read from the links."""
    with engine.connect() as c, c.begin() as t:
        c.execute(
            sa.text(
                "INSERT INTO dataminer.video_changes (video_id) SELECT video_id FROM dataminer.videos"
            )
        )
        read = video_totals(c, project, ["download", "frames"], 15)
        t.rollback()
    return (
        sorted(read.sources, key=lambda s: (s.source, s.source_info or "")),
        read.counts,
        read.finished,
    )


def test_a_change_after_the_copy_is_read_live_until_the_next_copy_writes_it(catalog):
    engine, a = catalog.engine, catalog.projects.get("a").id
    with engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'done', finished_at = now()
                        WHERE stage = 'download' AND item_key = 'v2'"""),
        )
        c.execute(sa.text("UPDATE dataminer.videos SET duration_s = 61 WHERE video_id = 'v2'"))
    assert notes(engine) >= 1
    changed = totals(engine, a)
    assert changed == live_totals(engine, a)
    assert changed[1]["download"] == {"done": 4}
    copy_link_progress(engine)
    assert notes(engine) == 0
    assert totals(engine, a) == changed
    with engine.connect() as c:
        link = c.execute(
            sa.text("""SELECT download_status, duration_s FROM dataminer.project_videos
                        WHERE video_id = 'v2'"""),
        ).one()
    assert tuple(link) == ("done", 61.0)


def test_marking_an_item_requested_notes_no_video(catalog):
    engine = catalog.engine
    before = notes(engine)
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE dataminer.work_items SET requested_at = now() WHERE stage = 'download'")
        )
    assert notes(engine) == before


@pytest.mark.parametrize("seed", range(3))
def test_any_changes_read_from_the_links_as_they_are_live_copied_or_not(catalog, seed):
    """Random changes of the items, links and videos, with copies of a few notes in between: the
    pass reads, after each, what the live state gives."""
    rng = random.Random(seed)
    engine = catalog.engine
    projects = [catalog.projects.get("a").id, catalog.projects.get("b").id]
    videos = list(VIDEOS)
    for _ in range(40):
        video, project = rng.choice(videos), rng.choice(projects)
        with engine.begin() as c:
            change = rng.choice(["item", "item", "no item", "link", "unlink", "video", "copy"])
            if change == "item":
                c.execute(
                    sa.text("""
                        INSERT INTO dataminer.work_items
                               (stage, item_key, video_id, status, max_attempts, finished_at)
                        VALUES (:stage, :v, :v, :status, 4,
                                now() - make_interval(mins => CAST(:minutes AS int)))
                        ON CONFLICT (stage, item_key) DO UPDATE
                           SET status = EXCLUDED.status, finished_at = EXCLUDED.finished_at"""),
                    {
                        "stage": rng.choice(["download", "frames"]),
                        "v": video,
                        "status": rng.choice(["pending", "done", "failed", "dead", "blocked"]),
                        "minutes": rng.choice([None, 1, 60]),
                    },
                )
            elif change == "no item":
                c.execute(
                    sa.text("DELETE FROM dataminer.work_items WHERE item_key = :v AND stage = :s"),
                    {"v": video, "s": rng.choice(["download", "frames"])},
                )
            elif change == "link":
                c.execute(
                    sa.text("""INSERT INTO dataminer.project_videos (project_id, video_id, source)
                               VALUES (:p, :v, 'url') ON CONFLICT DO NOTHING"""),
                    {"p": project, "v": video},
                )
            elif change == "unlink":
                c.execute(
                    sa.text("""DELETE FROM dataminer.project_videos
                                WHERE project_id = :p AND video_id = :v"""),
                    {"p": project, "v": video},
                )
            elif change == "video":
                c.execute(
                    sa.text(
                        "UPDATE dataminer.videos SET duration_s = :d, size_bytes = :b WHERE video_id = :v"
                    ),
                    {"v": video, "d": rng.choice([None, 5.0, 700.0]), "b": rng.randrange(10**9)},
                )
        if change == "copy":
            copy_link_progress(engine, limit=rng.randint(1, 4))
        for p in projects:
            assert totals(engine, p) == live_totals(engine, p), (seed, change)
    copy_link_progress(engine)
    assert notes(engine) == 0
    for p in projects:
        assert totals(engine, p) == live_totals(engine, p)
