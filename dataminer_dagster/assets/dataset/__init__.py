"""dataset: export a project's images, Parquet manifest and COCO annotations."""

from dataminer_dagster.engine.registry import DATASET, DETECT, PROJECTS, StageSpec

STAGE = StageSpec(
    DATASET,
    PROJECTS,
    lane="project",
    asset="dataset",
    description="export the dataset",
    reads=DETECT,
    after_members=True,
    home=__name__,
)
