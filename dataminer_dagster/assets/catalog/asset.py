"""video_catalog: find a project's videos (searches, URLs, URL files, local files) and link them.

Network I/O (YouTube search) happens here, in a run, never in a sensor. Searches use the
project's cookies, proxies and pace, and YouTube's shared throttle: when YouTube is paused for
longer than the run waits, the catalog is postponed (no attempt used) until the pause ends.
Linking is idempotent; a video the project links again is re-queued when it had failed or when its
files are gone.
"""

from __future__ import annotations

import functools

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.acquisition.inputs import collect_candidates
from dataminer_dagster.acquisition.options import merged_download_options
from dataminer_dagster.acquisition.ytdlp_search import YOUTUBE
from dataminer_dagster.engine.outcomes import ItemResult, Postponed
from dataminer_dagster.engine.registry import CATALOG
from dataminer_dagster.engine.stage import StageContext, StageItem, stage_asset

SOURCE_NAMES = {"search": "YouTube search", "url": "URL", "url_file": "URL file", "files": "files"}


def describe_sources(per_source: dict[str, int]) -> str:
    """Where the videos came from, e.g. "YouTube search 'street food': 20; URLs of the config: 6"."""
    parts = []
    for source, count in per_source.items():
        kind, _, what = source.partition(": ")
        name = (
            "URLs of the config"
            if source == "url: config"
            else f"{SOURCE_NAMES.get(kind, kind)} {what!r}"
        )
        parts.append(f"{name}: {count}")
    return "; ".join(parts) or "none"


@stage_asset(
    stage=CATALOG,
    required_resource_keys=["download_client"],
    kinds={"postgres"},  # searches go through yt-dlp; URLs and files are only linked
)
def video_catalog(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's videos: every search, URL, URL file and local file in its config, linked to it."""
    catalog = ctx.catalog
    project = catalog.project(item.key)
    if project is None:
        raise ValueError(f"project {item.key!r} is not registered (dataminer project add CONFIG)")
    options = merged_download_options([project.config.download], YOUTUBE)
    throttle = ctx.db.host_throttle(ctx.context.run_id, options, log=ctx.log.warning)
    search = functools.partial(ctx.download_client.search, options=options, throttle=throttle)
    try:
        found = collect_candidates(project.config.inputs, search)
    except HostPaused as exc:
        raise Postponed(f"{project.name}: {exc}", not_before=exc.pause.until) from exc
    for problem in found.problems:  # the first few: a file of bad lines must not flood the log
        ctx.log.warning(f"{project.name}: {problem}")
    if found.problems_not_kept:
        ctx.log.warning(
            f"{project.name}: {found.problems_not_kept} more problems like these are not shown "
            f"({found.problem_count} in all)"
        )
    if not found.candidates and found.problems:
        raise RuntimeError(f"no video found for project {project.name}: {found.summary()}")

    return ItemResult(
        metadata={
            "videos": len(found.candidates),
            "sources": describe_sources(found.per_source),
            "problems": found.summary() or "none",
        },
        outcome={"videos": len(found.candidates), "problems": found.problem_count},
        commit=lambda conn: catalog.link_and_queue(conn, project, found.candidates),
    )
