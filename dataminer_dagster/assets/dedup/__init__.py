"""dedup: remove near-duplicates among a finished project's kept frames, across its videos."""

from dataminer_dagster.engine.registry import DEDUP, FILTER, PROJECTS, StageSpec

STAGE = StageSpec(
    DEDUP,
    PROJECTS,
    lane="project",
    asset="deduped_set",
    description="deduplicate the frames that passed the filter",
    reads=FILTER,
    after_members=True,
    forceable=True,
    gpu=True,
    config=("dedup",),
    home=__name__,
)
