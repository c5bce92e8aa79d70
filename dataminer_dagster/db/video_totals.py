"""A project's videos read in one pass: per source what they gave (videos, downloads, minutes,
bytes, frames), and how many of them each per-video stage has in each status.

`dataminer status NAME` used to read the project's videos once for its work, once for its yield,
once for its frames and once for its target's budget; at a million videos each read is a hash
join over the whole project (0.6-0.7 s apiece on this machine), so they are one now (issue 25).
The pass costs what the project is large, never the catalog (bench/README.md, "Scale").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields

import sqlalchemy as sa

from dataminer_dagster.db.schema import DONE, LINKED_THROUGH_COPY, SCHEMA, finished_since_sql
from dataminer_dagster.engine.registry import DOWNLOAD

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


def video_totals(
    conn: sa.Connection, project_id: int, stages: Sequence[str], window_minutes: float = 0.0
) -> VideoTotals:
    """The project's videos in one pass (see the module's docstring): the status counts of each
    of `stages` (per-video stages, whose items are keyed by the video), and the items of each
    that finished in the last `window_minutes`. A video without an item of a stage counts for
    no status of it; a video linked to the project twice cannot be (one link per video)."""
    joined = list(dict.fromkeys([DOWNLOAD, *stages]))  # the download's status makes the yield
    joins = "".join(
        f"""
          LEFT JOIN {S}.work_items s{i} ON s{i}.stage = :stage_{i} AND s{i}.item_key = pv.video_id
                                       AND s{i}.project_id IS NULL"""
        for i in range(len(joined))
    )
    per_stage = "".join(
        f""",
               s{i}.status AS status_{i},
               count(*) FILTER (WHERE {finished_since_sql(f"s{i}")}) AS finished_{i}"""
        for i in range(len(joined))
    )
    statuses = ", ".join(f"s{i}.status" for i in range(len(joined)))
    statement = sa.text(f"""
        SELECT pv.source, pv.source_info{per_stage},
               count(*) AS videos,
               count(*) FILTER (WHERE s0.status = '{DONE}') AS downloaded,
               coalesce(sum(v.duration_s) FILTER (WHERE s0.status = '{DONE}'), 0) AS downloaded_s,
               CAST(coalesce(sum(v.size_bytes) FILTER (WHERE s0.status = '{DONE}'), 0) AS bigint)
                 AS downloaded_bytes,
               coalesce(sum(pv.frames_total), 0) AS extracted,
               coalesce(sum(pv.frames_passed), 0) AS passed,
               coalesce(sum(pv.frames_kept), 0) AS kept
          FROM {S}.project_videos pv
          JOIN {S}.videos v ON v.video_id = pv.video_id{joins}
         WHERE pv.project_id = :p
         GROUP BY pv.source, pv.source_info, {statuses}
    """)
    params = {
        "p": project_id,
        "window_s": window_minutes * 60.0,
        **{f"stage_{i}": stage for i, stage in enumerate(joined)},
    }
    sources: dict[tuple[str, str | None], dict[str, float]] = defaultdict(
        lambda: dict.fromkeys(_SUMMED, 0)
    )
    counts: dict[str, dict[str, int]] = {stage: {} for stage in stages}
    finished: dict[str, int] = dict.fromkeys(stages, 0)
    for row in conn.execute(statement, params):
        totals = sources[row.source, row.source_info]
        for name in totals:
            totals[name] += getattr(row, name)
        for i, stage in enumerate(joined):
            status = getattr(row, f"status_{i}")
            if stage in counts and status is not None:
                counts[stage][status] = counts[stage].get(status, 0) + row.videos
                finished[stage] += getattr(row, f"finished_{i}")
    return VideoTotals(
        sources=[SourceTotals(source, info, **t) for (source, info), t in sources.items()],
        counts=counts,
        finished=finished,
    )
