"""A project's videos read in one pass: per source what they gave (videos, downloads, minutes,
bytes, frames), and how many of them each per-video stage has in each status.

`dataminer status NAME` needs all of these (its work, its yield, its frames, its target's
budget); a read each, or one joining the links with the videos and every stage's items, would
cost a pass over a large project's items per question. The links carry their videos' progress
(db/link_progress.py), so the pass reads the project's links alone for the videos without a note
and the live state for the few with one, each side counted on its own, in one statement
(bench/README.md, "Figures behind the code").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields

import sqlalchemy as sa

from dataminer_dagster.db.link_progress import (
    ANY_NOTED_SQL,
    live_progress_joins,
    noted_sql,
    progress,
)
from dataminer_dagster.db.schema import (
    DONE,
    LINK_PROGRESS_STAGES,
    LINKED_THROUGH_COPY,
    SCHEMA,
    finished_within_sql,
)
from dataminer_dagster.registry import DOWNLOAD

S = SCHEMA


@dataclass(frozen=True)
class SourceTotals:
    """The project's videos found by one source (`source: source_info`)."""

    source: str
    source_info: str | None
    videos: int
    downloaded: int
    downloaded_s: float
    downloaded_bytes: int
    extracted: int  # frames extracted
    passed: int  # by the project's filter
    kept: int  # by dedup

    @property
    def name(self) -> str:
        """As the catalog names a candidate's source, e.g. "search: street food"."""
        return f"{self.source}: {self.source_info}"

    @property
    def linked_through_copy(self) -> bool:
        """Linked because another of the project's videos has the same content: not found by a
        source, so it counts for no source's yield or budget."""
        return self.source == LINKED_THROUGH_COPY


# SourceTotals' numbers: the statement's columns of the same names, summed over its rows.
_SUMMED = tuple(f.name for f in fields(SourceTotals) if f.name not in ("source", "source_info"))


@dataclass(frozen=True)
class VideoTotals:
    sources: list[SourceTotals]  # copies' own row included
    counts: dict[str, dict[str, int]]  # {stage: {status: videos whose item has it}}
    finished: dict[str, int]  # {stage: items finished (done, dead, blocked) in the window}

    @property
    def videos(self) -> int:
        """Every video linked to the project, copies included."""
        return sum(s.videos for s in self.sources)

    @property
    def found(self) -> list[SourceTotals]:
        """The sources' rows, without the copies'."""
        return [s for s in self.sources if not s.linked_through_copy]


def _group_columns() -> list[str]:
    return ["source", "source_info", *(f"status_{i}" for i in range(len(LINK_PROGRESS_STAGES)))]


def _finished_columns() -> list[str]:
    return [f"finished_{i}" for i in range(len(LINK_PROGRESS_STAGES))]


def _side(columns: dict[str, str], rest: str) -> str:
    """SQL: one side of the pass, the project's links `pv` with `columns` for their progress
    (`link_progress.progress`), joined and filtered by `rest`, counted per source and statuses."""
    statuses = [columns[f"{stage}_status"] for stage in LINK_PROGRESS_STAGES]
    finished = [
        f"count(*) FILTER (WHERE {finished_within_sql(status, columns[f'{stage}_finished_at'])})"
        for stage, status in zip(LINK_PROGRESS_STAGES, statuses, strict=True)
    ]
    downloaded = f"{columns[f'{DOWNLOAD}_status']} = '{DONE}'"
    values = [
        "pv.source",
        "pv.source_info",
        *statuses,
        "count(*)",
        f"count(*) FILTER (WHERE {downloaded})",
        f"coalesce(sum({columns['duration_s']}) FILTER (WHERE {downloaded}), 0)",
        f"coalesce(sum({columns['size_bytes']}) FILTER (WHERE {downloaded}), 0)",
        "coalesce(sum(pv.frames_total), 0)",
        "coalesce(sum(pv.frames_passed), 0)",
        "coalesce(sum(pv.frames_kept), 0)",
        *finished,
    ]
    names = [*_group_columns(), *_SUMMED, *_finished_columns()]
    grouped = ", ".join(["pv.source", "pv.source_info", *statuses])
    return f"""
        SELECT {", ".join(f"{v} AS {n}" for v, n in zip(values, names, strict=True))}
          FROM {S}.project_videos pv {rest}
         GROUP BY {grouped}"""


def video_totals(
    conn: sa.Connection, project_id: int, stages: Sequence[str], window_minutes: float = 0.0
) -> VideoTotals:
    """The project's videos in one pass (see the module's docstring): the status counts of each
    of `stages` (per-video stages whose progress the links carry), and the items of each that
    finished in the last `window_minutes`. A video without an item of a stage counts for no
    status of it; a video linked to the project twice cannot be (one link per video)."""
    unknown = set(stages) - set(LINK_PROGRESS_STAGES)
    if unknown:
        raise ValueError(f"the links carry no progress of {sorted(unknown)}")
    # Each side counted on its own, grouped by columns PostgreSQL has statistics of: grouped as
    # a whole, the union's groups are estimated far too many and sorted on disk.
    # The live side runs only while some video has a note: planned from statistics that still
    # count the thousands of notes a copy has since removed, its joins would otherwise read every
    # video and item to find nothing.
    live = f"pv.project_id = :p AND {ANY_NOTED_SQL} AND {noted_sql('pv')}"
    sides = [
        (progress("pv", live=False), f"WHERE pv.project_id = :p AND NOT {noted_sql('pv')}"),
        (progress("pv", live=True), f"{live_progress_joins('pv')}\n WHERE {live}"),
    ]
    counted = "\n UNION ALL\n".join(_side(columns, rest) for columns, rest in sides)
    summed = ", ".join(
        f"CAST(sum({name}) AS {'float8' if name == 'downloaded_s' else 'bigint'}) AS {name}"
        for name in (*_SUMMED, *_finished_columns())
    )
    groups = ", ".join(_group_columns())
    statement = sa.text(f"""
        SELECT {groups}, {summed} FROM ({counted}) side GROUP BY {groups}
    """)
    params = {"p": project_id, "window_s": window_minutes * 60.0}
    sources: dict[tuple[str, str | None], dict[str, float]] = defaultdict(
        lambda: dict.fromkeys(_SUMMED, 0)
    )
    counts: dict[str, dict[str, int]] = {stage: {} for stage in stages}
    finished: dict[str, int] = dict.fromkeys(stages, 0)
    for row in conn.execute(statement, params):
        totals = sources[row.source, row.source_info]
        for name in totals:
            totals[name] += getattr(row, name)
        for i, stage in enumerate(LINK_PROGRESS_STAGES):
            status = getattr(row, f"status_{i}")
            if stage in counts and status is not None:
                counts[stage][status] = counts[stage].get(status, 0) + row.videos
                finished[stage] += getattr(row, f"finished_{i}")
    return VideoTotals(
        sources=[SourceTotals(source, info, **t) for (source, info), t in sources.items()],
        counts=counts,
        finished=finished,
    )
