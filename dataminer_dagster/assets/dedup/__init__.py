"""dedup: remove near-duplicates among a finished project's kept frames, across its videos."""

from dataminer_dagster.registry import DEDUP, FILTER, PROJECT_LANE, PROJECTS, StageSpec

STAGE = StageSpec(
    DEDUP,
    PROJECTS,
    lane=PROJECT_LANE,
    asset="deduped_set",
    description="deduplicate the frames that passed the filter",
    reads=FILTER,
    after_members=True,
    forceable=True,
    gpu=True,
    config=("dedup",),
    home=__name__,
)
