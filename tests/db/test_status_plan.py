"""Statements that run at any catalog size read the rows they concern through indexes, never the
whole catalog (issue 25): `dataminer status`'s counts of a project's work (at 1M videos an
`OR ... IN (subquery)` became a plain SubPlan over all of project_videos and status never ended),
the catalog's lock of the videos it links, and the work sensor's look at the work in flight.

The check is on PostgreSQL's own plan (EXPLAIN, or EXPLAIN ANALYZE for the rows read) of the
statements as the product sends them, on a seeded catalog of 20,000 videos beside a small
project, so a regression fails here in CI."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.link_progress import copy_link_progress
from dataminer_dagster.db.reports import recent_failures, stage_counts, work_summary
from dataminer_dagster.paths import DataPaths
from tests.helpers.catalog_seed import add_project, seed_videos
from tests.helpers.statements import statements_sent

BIG, SMALL = 20_000, 20
CATALOG_TABLES = {"work_items", "project_videos", "videos"}


@pytest.fixture
def seeded(engine, tmp_path) -> tuple[sa.Engine, int, int]:
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    big, small = add_project(catalog, "big"), add_project(catalog, "small")
    seed_videos(engine, big, BIG, "b")
    seed_videos(engine, small, SMALL, "s")
    return engine, big, small


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def whole_table_reads(plan: dict) -> list[str]:
    """What in a plan reads a catalog table whole: a sequential scan of it, or a subquery run as
    a SubPlan (once per outer row, over a materialized read of its table)."""
    found = []
    for node in nodes(plan):
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in CATALOG_TABLES:
            found.append(f"Seq Scan on {node['Relation Name']}")
        if node.get("Parent Relationship") == "SubPlan":
            found.append(f"SubPlan {node.get('Subplan Name')}")
    return found


def plans_of(engine: sa.Engine, call, analyze: bool = False) -> list[dict]:
    """PostgreSQL's plan of each statement that `call` sends, with the parameters it sent (with
    `analyze`, run again under EXPLAIN ANALYZE: the rows each node read)."""
    sent = [
        (statement, parameters)
        for statement, parameters in statements_sent(engine, call)
        if statement.lstrip().upper().startswith(("SELECT", "WITH"))
    ]
    assert sent
    explain = "EXPLAIN (ANALYZE, FORMAT JSON)" if analyze else "EXPLAIN (FORMAT JSON)"
    with engine.connect() as c:
        return [
            c.exec_driver_sql(f"{explain} {statement}", parameters).scalar()[0]["Plan"]
            for statement, parameters in sent
        ]


def catalog_rows_read(plan: dict) -> int:
    """How many rows of the catalog's tables an analyzed plan's scans read, kept or not."""
    return sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in nodes(plan)
        if node.get("Relation Name") in CATALOG_TABLES
    )


def test_the_plan_check_catches_the_statement_that_never_ended_at_a_million_videos(seeded):
    engine, _, small = seeded
    before = """SELECT w.stage, w.status, count(*) FROM dataminer.work_items w
                 WHERE w.project_id = %(p)s
                    OR (w.stage = ANY(ARRAY['download', 'frames'])
                        AND w.video_id IN (SELECT video_id FROM dataminer.project_videos
                                            WHERE project_id = %(p)s))
                 GROUP BY 1, 2"""
    with engine.connect() as c:
        plan = c.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {before}", {"p": small}).scalar()
    assert whole_table_reads(plan[0]["Plan"]), "the check sees the old statement's full scan"


@pytest.mark.parametrize(
    "report",
    [
        lambda engine, p: stage_counts(engine, p),
        lambda engine, p: work_summary(engine, p, 15),
        lambda engine, p: recent_failures(engine, p),
    ],
    ids=["stage_counts", "work_summary", "recent_failures"],
)
def test_a_projects_status_reads_only_its_own_rows(seeded, report):
    engine, _, small = seeded
    for plan in plans_of(engine, lambda: report(engine, small)):
        assert whole_table_reads(plan) == [], plan


def test_a_projects_copies_are_read_from_the_copies_not_from_its_videos(seeded, tmp_path):
    """`dataminer status NAME` lists the project's videos that are copies of another: read from
    the few copies (a partial index), not from the project's million videos."""
    engine, big, _ = seeded
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    for plan in plans_of(engine, lambda: catalog.videos.project_copies(big), analyze=True):
        assert whole_table_reads(plan) == [], plan
        assert catalog_rows_read(plan) < 100, plan


def status_reads(engine: sa.Engine, project: int) -> Counter:
    """The rows of each catalog table that `dataminer status NAME`'s pass over the project's
    videos reads (a table may be read in both of its sides)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(sa.text("VACUUM ANALYZE dataminer.project_videos"))
    [plan] = [
        plan
        for plan in plans_of(engine, lambda: work_summary(engine, project, 15), analyze=True)
        if any(node.get("Relation Name") == "project_videos" for node in nodes(plan))
    ]
    read = Counter()
    for node in nodes(plan):
        if node.get("Relation Name") in CATALOG_TABLES:
            read[node["Relation Name"]] += catalog_rows_read({**node, "Plans": []})
    return read


def note_videos(engine: sa.Engine, project: int, count: int) -> None:
    """A progress note on `count` of the project's videos, as the triggers write one."""
    with engine.begin() as c:
        c.execute(
            sa.text("""INSERT INTO dataminer.video_changes (video_id)
                       SELECT video_id FROM dataminer.project_videos WHERE project_id = :p
                        LIMIT :n"""),
            {"p": project, "n": count},
        )


def analyze_the_notes_full(engine: sa.Engine) -> None:
    """PostgreSQL's statistics taken while every seeded video has a note (as autovacuum may take
    them after a bulk fill)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(
            sa.text("ANALYZE dataminer.video_changes, dataminer.videos, dataminer.work_items")
        )


def test_a_projects_videos_are_read_from_its_links_once_their_progress_is_copied(seeded):
    """`dataminer status NAME`'s pass over a project's videos: with their progress copied onto
    the links (db/link_progress.py) it reads the links alone, no video and no item, whatever
    PostgreSQL's statistics say of the notes: here they count thousands no longer there (as
    where the copy could not take them again)."""
    engine, big, _ = seeded
    while copy_link_progress(engine):
        pass
    note_videos(engine, big, BIG)
    analyze_the_notes_full(engine)
    with engine.begin() as c:
        c.execute(sa.text("DELETE FROM dataminer.video_changes"))
    read = status_reads(engine, big)
    assert read["project_videos"] >= BIG, read
    assert read["videos"] + read["work_items"] == 0, read  # no live side ran


def test_a_copy_that_removed_many_notes_takes_their_statistics_again(seeded):
    """A note left anywhere (here on another project's video) runs the pass's live side for
    every project; planned from statistics that still counted the notes a bulk copy removed, it
    would read every video. The copy that takes the last notes has them analyzed again
    (`ANALYZE_AFTER`)."""
    engine, big, small = seeded
    analyze_the_notes_full(engine)
    while copy_link_progress(engine):
        pass
    note_videos(engine, small, 1)
    read = status_reads(engine, big)
    assert read["project_videos"] >= BIG, read
    # the live side, which has no link of the big project to read, may still start a join (a row)
    assert read["videos"] + read["work_items"] < 10, read


def test_the_counts_are_each_projects_own(seeded):
    engine, big, small = seeded
    for project, n in ((big, BIG), (small, SMALL)):
        counts = stage_counts(engine, project)
        assert {stage: {s: c for s, c in by.items() if c} for stage, by in counts.items()} == {
            "download": {"done": n},
            "frames": {"done": n},
            "filter": {"pending": n},
            "catalog": {"pending": 1},  # its inputs, not listed yet
        }
        summary = work_summary(engine, project, 15)
        assert summary.counts == counts
        assert summary.finished == {"download": n, "frames": n}
        assert summary.stale == {}


def test_a_projects_latest_failures_are_read_from_the_failures(seeded):
    """`dataminer status NAME` lists the project's ten latest failures, its own and its videos':
    read newest first from the failures (`work_items_troubled_own`, `_videos`), not from its videos' items (a
    scan of every item without a project: 0.2 s at 1,000,000 videos)."""
    engine, big, small = seeded
    troubled = [  # (video, stage, status, project's own, minutes ago)
        ("b1", "download", "failed", False, 1),
        ("b2", "frames", "dead", False, 2),
        ("b3", "filter", "blocked", True, 3),
        ("s1", "download", "dead", False, 4),  # the small project's video
        ("b4", "filter", "failed", True, 5),
    ]
    with engine.begin() as c:
        for video, stage, status, own, minutes in troubled:
            updated = c.execute(
                sa.text("""UPDATE dataminer.work_items
                               SET status = :status, last_error = 'broke: ' || :video,
                                   updated_at = now() - make_interval(mins => :minutes)
                             WHERE stage = :stage AND video_id = :video
                               AND (project_id IS NOT NULL) = :own"""),
                {"status": status, "video": video, "stage": stage, "own": own, "minutes": minutes},
            )
            assert updated.rowcount == 1
        # Older: 5,000 downloads blocked by a rule, as a catalog of long videos has many.
        c.execute(
            sa.text("""UPDATE dataminer.work_items
                          SET status = 'blocked', last_error = 'longer than max_duration_s',
                              updated_at = now() - interval '1 day'
                        WHERE stage = 'download' AND video_id IN
                              (SELECT 'b' || g FROM generate_series(1001, 6000) g)""")
        )
        c.execute(sa.text("ANALYZE dataminer.work_items"))
    assert [(f.stage, f.status, f.last_error) for f in recent_failures(engine, big, 4)] == [
        ("download", "failed", "broke: b1"),
        ("frames", "dead", "broke: b2"),
        ("filter", "blocked", "broke: b3"),
        ("filter", "failed", "broke: b4"),
    ]
    assert [(f.stage, f.last_error) for f in recent_failures(engine, small)] == [
        ("download", "broke: s1")
    ]
    assert [f.last_error for f in recent_failures(engine, big)][4:] == [
        "longer than max_duration_s"
    ] * 6
    for project in (big, small):
        for plan in plans_of(engine, lambda p=project: recent_failures(engine, p), analyze=True):
            assert whole_table_reads(plan) == [], plan
            assert catalog_rows_read(plan) < 100, plan


def test_linking_videos_reads_only_their_rows(seeded, tmp_path):
    """The catalog stage links a batch of videos to a project (`link_and_queue`): its lock of
    the videos and their originals reads those rows, not the catalog (an `= ANY(...) OR IN
    (subquery)` was a scan of every video: a minute a batch at 500,000 videos)."""
    from dataminer_dagster.acquisition.video_ids import Candidate

    engine, _, small = seeded
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    project = catalog.projects.get("small")
    candidates = [Candidate(f"new{n}", "url", url=f"https://example.com/new{n}") for n in range(5)]

    def link() -> None:
        with engine.begin() as conn:
            catalog.videos.link(conn, project, candidates)

    locks = [p for p in plans_of(engine, link) if p["Node Type"] == "LockRows"]
    assert locks, "the lock statement was sent"
    for plan in locks:
        assert whole_table_reads(plan) == [], plan


def test_what_is_coming_to_the_filter_is_found_from_the_work_in_flight(seeded):
    """The work sensor asks every tick which project videos the downloads in flight will bring
    to the filter (`coming`): it starts from the items in flight, each kind by its own index (as
    one OR over the items it was a scan of every item: 0.1-2.8 s a tick at 1,000,000 videos)."""
    from dataminer_dagster.db.scheduling import coming
    from dataminer_dagster.registry import FILTER

    engine, _, _ = seeded
    with engine.begin() as c:  # every download waits, as in a catalog just filled; 50 requested
        c.execute(
            sa.text("UPDATE dataminer.work_items SET status = 'pending' WHERE stage = 'download'")
        )
        in_flight = list(
            c.execute(
                sa.text("""UPDATE dataminer.work_items SET requested_at = now()
                            WHERE stage = 'download'
                              AND item_key IN (SELECT 'b' || g FROM generate_series(1, 50) g)
                           RETURNING id""")
            ).scalars()
        )
        c.execute(  # five videos' extraction asked for again too: each project video once
            sa.text("""UPDATE dataminer.work_items SET status = 'pending', requested_at = now()
                        WHERE stage = 'frames'
                          AND item_key IN (SELECT 'b' || g FROM generate_series(1, 5) g)""")
        )
        c.execute(
            sa.text("""DELETE FROM dataminer.work_items WHERE stage = 'filter'
                        AND video_id IN (SELECT 'b' || g FROM generate_series(1, 60) g)""")
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(sa.text("ANALYZE dataminer.work_items"))
    found: list[str] = []
    plans = plans_of(
        engine, lambda: found.extend(coming(engine, FILTER, planned_ids=in_flight)), analyze=True
    )
    assert sorted(found) == sorted(f"big.b{n}" for n in range(1, 51))
    for plan in plans:
        assert catalog_rows_read(plan) <= 10 * len(in_flight), plan


def test_the_items_to_request_are_read_in_due_order_up_to_the_limit(seeded):
    """The work sensor asks every tick for the next items of a lane's stages (`requestable`):
    each stage's items are walked in due order and the walk stops at the limit (over both
    stages at once, every waiting item was read and sorted: 55 ms a tick at 100,000 waiting
    downloads)."""
    from dataminer_dagster.db.scheduling import requestable
    from dataminer_dagster.registry import DOWNLOAD, FRAMES

    engine, _, _ = seeded
    with engine.begin() as c:  # every download waits, as in a catalog just filled
        c.execute(
            sa.text("UPDATE dataminer.work_items SET status = 'pending' WHERE stage = 'download'")
        )
    found: list = []
    plans = plans_of(
        engine,
        lambda: found.extend(requestable(engine, [DOWNLOAD, FRAMES], 50, 60.0)),
        analyze=True,
    )
    assert len(found) == 50
    for plan in plans:
        assert catalog_rows_read(plan) <= 10 * 50, plan
