"""video_catalog: find a project's videos (searches, listings, URLs, URL files, local files) and
link them.

Network I/O (YouTube search, feeds, channels) happens here, in a run, never in a sensor. Searches
and listings use the project's cookies, proxies and pace, and the hosts' shared throttle: when a
host is paused for longer than the run waits, the catalog is postponed (no attempt used) until
the pause ends. Linking is idempotent; a video the project links again is re-queued when it had
failed or when its files are gone. A refresh (db/source_refresh.py) links only the videos the
project has not seen, and what each search and listing found is recorded per source.
"""

from __future__ import annotations

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.assets.catalog.inputs import find_videos
from dataminer_dagster.assets.catalog.source_choice import MAX_DEPTH, SourceYield, choose
from dataminer_dagster.db import source_refresh
from dataminer_dagster.db.acquisition_rounds import (
    acquisition_state,
    budget_left,
    record_round,
    spent_of,
)
from dataminer_dagster.db.video_totals import video_totals
from dataminer_dagster.engine.outcomes import ItemResult, PermanentFailure, Postponed
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.registry import CATALOG

SOURCE_NAMES = {
    "search": "YouTube search",
    "listing": "listing",
    "url": "URL",
    "url_file": "URL file",
    "files": "files",
}


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
    """The project's videos: every search, listing, URL, URL file and local file in its config,
    linked to it (on a refresh: only those it has not seen)."""
    catalog = ctx.catalog
    project = catalog.projects.get(item.key)
    if project is None:
        raise ValueError(f"project {item.key!r} is not registered (dataminer project add CONFIG)")
    target = project.config.target
    with catalog.engine.connect() as conn:
        refresh = source_refresh.refresh_requested(conn, project.id)
        waiting = source_refresh.waiting_sources(conn, project.id)
        round_ = acquisition_state(conn, project.id)["round"] if target else 0
    try:
        found = find_videos(
            listed_deeper(project.config.inputs, round_),
            project.config.download,
            ctx.download_client,
            lambda options: ctx.db.host_throttle(ctx.context.run_id, options, log=ctx.log.warning),
            skip=waiting,
        )
    except HostPaused as exc:
        raise Postponed(f"{project.name}: {exc}", not_before=exc.pause.until) from exc
    for source in sorted(waiting):
        ctx.log.warning(f"{project.name}: {source} failed before; it is asked again later")
    for problem in found.problems:  # the first few: a file of bad lines must not flood the log
        ctx.log.warning(f"{project.name}: {problem}")
    if found.problems_not_kept:
        ctx.log.warning(
            f"{project.name}: {found.problems_not_kept} more problems like these are not shown "
            f"({found.problem_count} in all)"
        )
    if not found.candidates and found.problems and not refresh:
        # Retried only when a problem may pass (a search or listing that failed, a file that
        # could not be read); bad lines and URLs stay bad, and the project fails at once.
        fault = RuntimeError if found.transient else PermanentFailure
        raise fault(f"no video found for project {project.name}: {found.summary()}")

    with catalog.engine.connect() as conn:
        unseen = source_refresh.unseen(conn, project.id, [c.video_id for c in found.candidates])
    new = unseen
    if target is not None:
        new = _toward_target(catalog, project, found.candidates, unseen)
        ctx.log.info(
            f"{project.name}, acquisition round {round_}: {len(new)} of the {len(unseen)} new "
            f"videos taken toward the target of {target.images} images"
        )
    # The new videos (those taken toward a target), and on a listing that is not a refresh the
    # videos the project has already, which are queued again when they had failed.
    linked = [
        c
        for c in found.candidates
        if c.video_id in new or (not refresh and c.video_id not in unseen)
    ]
    if refresh:
        ctx.log.info(f"refresh of {project.name}: {len(new)} new videos of {len(found.candidates)}")

    def commit(conn) -> None:
        catalog.link_and_queue(conn, project, linked)
        if target is not None:
            record_round(conn, project.id, round_, len(new))
        source_refresh.record_listing(
            conn,
            project.id,
            {s: n for s, n in found.per_source.items() if s.startswith(REFRESHED_SOURCES)},
            _new_per_source(found.candidates, new),
            found.failed_sources,
        )

    return ItemResult(
        metadata={
            "videos": len(found.candidates),
            "new_videos": len(new),
            "refresh": refresh,
            "sources": describe_sources(found.per_source),
            "problems": found.summary() or "none",
        },
        outcome={
            "videos": len(found.candidates),
            "new_videos": len(new),
            "problems": found.problem_count,
            "refresh": refresh,
        },
        commit=commit,
    )


REFRESHED_SOURCES = ("search: ", "listing: ")  # the sources recorded per source


def listed_deeper(inputs, round_: int):
    """The inputs of acquisition round `round_` (0: the first listing): each search and listing
    read 2^round as deep (at most MAX_DEPTH), so that a round finds videos the earlier ones did
    not and leaves a choice among them."""
    if round_ == 0:
        return inputs
    factor = 2**round_
    deeper = {"max_per_listing": min(inputs.max_per_listing * factor, MAX_DEPTH)}
    if inputs.search is not None:
        depth = min(inputs.search.max_results_per_query * factor, MAX_DEPTH)
        deeper["search"] = inputs.search.model_copy(update={"max_results_per_query": depth})
    return inputs.model_copy(update=deeper)


def _toward_target(catalog, project, candidates, new: set[str]) -> set[str]:
    """The new videos this round takes: as many as the target still needs by the yield so far,
    within the budget, from the sources with the best yield (assets/catalog/source_choice.py)."""
    target = project.config.target
    with catalog.engine.connect() as conn:
        videos = video_totals(conn, project.id, ())
    yields = {s.name: SourceYield(s.downloaded, s.kept) for s in videos.found}
    remaining, _ = budget_left(target.model_dump(), spent_of(videos))
    by_source: dict[str, list[str]] = {}
    for c in candidates:
        if c.video_id in new:
            by_source.setdefault(f"{c.source}: {c.source_info}", []).append(c.video_id)
    kept = sum(y.kept for y in yields.values())
    return set(
        choose(
            by_source,
            yields,
            need=max(target.images - kept, 0),
            limit=remaining,
            by_yield=target.order == "yield",
        )
    )


def _new_per_source(candidates, new: set[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in candidates:
        if c.video_id in new and c.source in ("search", "listing"):
            key = f"{c.source}: {c.source_info}"
            counts[key] = counts.get(key, 0) + 1
    return counts
