"""A project's videos read in one pass (db/video_totals.py) give `dataminer status NAME` its work
counts, its yield per source, its frames and its target's budget: the same numbers as the
overview's own count of the work (`stage_counts`, a different statement) and as the videos hold,
with a video shared by two projects, a copy, a video without items and items finished long ago."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from dataminer_dagster.db.acquisition_rounds import spent
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.reports import project_status, source_yield, stage_counts, work_summary
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


@pytest.fixture
def catalog(engine, tmp_path) -> Catalog:
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
    return catalog


def nonzero(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {stage: {s: n for s, n in by.items() if n} for stage, by in counts.items()}


def test_the_pass_counts_the_work_as_the_overview_does(catalog):
    a, b = catalog.project("a").id, catalog.project("b").id
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
    a = catalog.project("a").id
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
    status = project_status(catalog, catalog.project("a"), 15, load_settings().long_running)
    assert status["videos"] == 5
    assert status["frames"]["extracted"] == 170
    assert status["frames"]["passed_filter"] == 47
    assert [y["source"] for y in status["yield"]] == ["search: cats", "url: None"]
    by_stage = {s["stage"]: s for s in status["stages"]}
    assert (by_stage["download"]["done"], by_stage["download"]["finished_in_window"]) == (3, 2)
    assert by_stage["frames"]["pending"] == 1
