"""Each project video carries its video's progress (migration 0014): the status and end of its
download and extraction items, the video's length and size. Triggers note a video in
`video_changes`, in the transaction of the change, when any of these moves or when it is linked;
`copy_link_progress` writes the noted videos' current state onto their links and removes the
notes it acted on. A read that takes the links' columns for the videos without a note and the
live state for those with one (`progress`, `live_progress_joins`, `noted_sql`) is exact in any
snapshot, copied or not: a change and its note commit together, and a copy's writes and its
removal of the notes too.

Why not counts kept by the triggers themselves: a video's items count for every project that
links it, so a trigger on the items would have to see links being made at that moment, and a
lock both sides take would make a claim and a catalog run wait for each other (docs/
architecture.md, "Under the daemon").
"""

from __future__ import annotations

import sqlalchemy as sa

from dataminer_dagster.db.schema import LINK_PROGRESS_STAGES, SCHEMA

S = SCHEMA

# Copies never overlap: one that began earlier could write an older state over a later one's,
# whose notes are gone. A copy that finds another at work leaves the notes to the next.
_COPY_LOCK = 0x646D_6C70  # "dmlp"

# Notes acted on by one copy at most: a copy stays short (the tick's budget) after a bulk change.
COPY_LIMIT = 10_000
# Once a copy has taken every note it could, PostgreSQL's statistics of the notes are taken again
# where they still count this many (or were never taken: it then guesses from the table's pages):
# until autovacuum's next look, reads of the few notes left (a status pass's live side) would be
# planned for all of those removed, and read every video.
ANALYZE_AFTER = 1_000


# The aliases of the live state's rows: each stage's item (by the stage's index) and the video.
_ITEM = "lp{}"
_VIDEO = "lv"


def _progress_columns() -> list[tuple[str, str]]:
    """(link column, its live expression through `live_progress_joins`) of each progress column."""
    columns = []
    for i, stage in enumerate(LINK_PROGRESS_STAGES):
        item = _ITEM.format(i)
        columns += [
            (f"{stage}_status", f"{item}.status"),
            (f"{stage}_finished_at", f"{item}.finished_at"),
        ]
    return columns + [
        ("duration_s", f"{_VIDEO}.duration_s"),
        ("size_bytes", f"{_VIDEO}.size_bytes"),
    ]


def live_progress_joins(link: str) -> str:
    """SQL: the joins that give link `link` its video's live progress (`progress(live=True)`)."""
    joins = f"\n  JOIN {S}.videos {_VIDEO} ON {_VIDEO}.video_id = {link}.video_id"
    for i, stage in enumerate(LINK_PROGRESS_STAGES):
        item = _ITEM.format(i)
        joins += f"""
  LEFT JOIN {S}.work_items {item} ON {item}.stage = '{stage}'
        AND {item}.item_key = {link}.video_id AND {item}.project_id IS NULL"""
    return joins


def progress(link: str, *, live: bool) -> dict[str, str]:
    """{progress column: SQL expression} of link `link`: its own columns (`live` False) or its
    video's state read through `live_progress_joins`."""
    return {
        column: expression if live else f"{link}.{column}"
        for column, expression in _progress_columns()
    }


def noted_sql(link: str) -> str:
    """SQL: link `link`'s video has a note, so its own progress may be behind."""
    return f"EXISTS (SELECT 1 FROM {S}.video_changes n WHERE n.video_id = {link}.video_id)"


# SQL: some video has a note. Uncorrelated, so PostgreSQL evaluates it once, before the joins of
# the query it filters, and runs none of them when it is false.
ANY_NOTED_SQL = f"EXISTS (SELECT FROM {S}.video_changes)"


def copy_link_progress(engine: sa.Engine, limit: int = COPY_LIMIT) -> int:
    """Write the current progress of (at most `limit` notes' worth of) noted videos onto their
    links, and remove those notes; returns the notes removed. Links another transaction holds
    are left (`SKIP LOCKED`: a copy never waits, and never deadlocks with a deletion or the
    filter writing a link's frame counts), and so is their video's note, for the next copy."""
    columns = [column for column, _ in _progress_columns()]
    assignments = ", ".join(f"{column} = live.{column}" for column in columns)
    differs = " OR ".join(f"pv.{column} IS DISTINCT FROM live.{column}" for column in columns)
    live = ", ".join(f"{e} AS {c}" for c, e in progress("l", live=True).items())
    statement = sa.text(f"""
        WITH taken AS (
            SELECT id, video_id FROM {S}.video_changes ORDER BY id LIMIT :limit
               FOR UPDATE SKIP LOCKED
        ), links AS (
            SELECT pv.project_id, pv.video_id FROM {S}.project_videos pv
             WHERE pv.video_id IN (SELECT video_id FROM taken)
        ), locked AS (
            SELECT pv.project_id, pv.video_id FROM {S}.project_videos pv
             WHERE pv.video_id IN (SELECT video_id FROM taken)
               FOR UPDATE OF pv SKIP LOCKED
        ), skipped AS (
            SELECT video_id FROM (SELECT * FROM links EXCEPT SELECT * FROM locked) held
        ), live AS (
            SELECT l.project_id, l.video_id, {live}
              FROM locked l{live_progress_joins("l")}
        ), copied AS (
            UPDATE {S}.project_videos pv SET {assignments}
              FROM live
             WHERE pv.project_id = live.project_id AND pv.video_id = live.video_id
               AND ({differs})
        )
        DELETE FROM {S}.video_changes n USING taken t
         WHERE n.id = t.id AND t.video_id NOT IN (SELECT video_id FROM skipped)
    """)  # `copied` runs whether or not it is read, as every data-modifying WITH does
    with engine.begin() as conn:
        if not conn.execute(
            sa.text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": _COPY_LOCK}
        ).scalar():
            return 0
        # Nothing noted: the quiet tick's case, answered without planning the copy (whose plan,
        # until PostgreSQL's statistics know a bulk fill's links, reads them all). In the same
        # look, how many notes those statistics count.
        noted, counted = conn.execute(
            sa.text(f"""SELECT {ANY_NOTED_SQL}, (SELECT reltuples FROM pg_class
                                                  WHERE oid = CAST(:t AS regclass))"""),
            {"t": f"{S}.video_changes"},
        ).one()
        removed = conn.execute(statement, {"limit": limit}).rowcount if noted else 0
    if removed < limit and (counted < 0 or counted >= ANALYZE_AFTER):
        _analyze_notes(engine)
    return removed


def _analyze_notes(engine: sa.Engine) -> None:
    """Take PostgreSQL's statistics of the notes again; skipped (never waited for) while a vacuum
    holds the table, and by PostgreSQL with a warning where the database user does not own it."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"ANALYZE (SKIP_LOCKED) {S}.video_changes"))
