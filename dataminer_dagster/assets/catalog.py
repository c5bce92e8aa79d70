"""video_catalog: find a project's videos (searches, URLs, URL files, local files) and link them.

Network I/O (YouTube search) happens here, in a run, never in a sensor. Linking is idempotent; a
video the project links again is re-queued when it had failed or when its files are gone.
"""

from __future__ import annotations

from dataminer_dagster.acquisition.inputs import collect_candidates
from dataminer_dagster.assets.stage import ItemResult, StageContext, StageItem, stage_asset
from dataminer_dagster.stages import CATALOG


@stage_asset(
    stage=CATALOG,
    required_resource_keys=["download_client"],
    kinds={"youtube"},
)
def video_catalog(item: StageItem, ctx: StageContext) -> ItemResult:
    """The project's videos: every search, URL, URL file and local file in its config, linked to it."""
    catalog = ctx.catalog
    project = catalog.project(item.key)
    if project is None:
        raise ValueError(f"project {item.key!r} is not registered (dataminer project add CONFIG)")
    found = collect_candidates(project.config.inputs, ctx.resources.download_client.search)
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
            "per_source": found.per_source,
            "problems": found.summary() or "none",
        },
        outcome={"videos": len(found.candidates), "problems": found.problem_count},
        commit=lambda conn: catalog.link_and_queue(conn, project, found.candidates),
    )
