"""dataset: export a project's images, Parquet manifest and annotations, split by source, in
the training formats its config names, with a quality report."""

from dataminer_dagster.registry import DATASET, DETECT, PROJECT_LANE, PROJECTS, StageSpec

STAGE = StageSpec(
    DATASET,
    PROJECTS,
    lane=PROJECT_LANE,
    asset="dataset",
    description="export the dataset",
    reads=DETECT,
    after_members=True,
    config=("dataset",),
    forceable=True,  # after a review import (`dataminer review import`), or by hand
    home=__name__,
)
