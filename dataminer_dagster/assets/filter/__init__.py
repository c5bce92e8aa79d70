"""filter: score each project video's frames against the project's prompts (SigLIP2)."""

from dataminer_dagster.registry import FILTER, FILTER_LANE, FRAMES, PROJECT_VIDEOS, StageSpec

STAGE = StageSpec(
    FILTER,
    PROJECT_VIDEOS,
    lane=FILTER_LANE,
    asset="filtered_frames",
    description="score a video's frames",
    reads=FRAMES,
    gpu=True,
    config=("filter",),
    home=__name__,
)
