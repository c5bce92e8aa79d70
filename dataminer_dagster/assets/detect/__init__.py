"""detect: detect objects in a project's deduplicated frames (YOLO, OWLv2, Grounding DINO)."""

from dataminer_dagster.registry import DEDUP, DETECT, PROJECT_LANE, PROJECTS, StageSpec

STAGE = StageSpec(
    DETECT,
    PROJECTS,
    lane=PROJECT_LANE,
    asset="detections",
    description="detect objects in the deduplicated frames",
    reads=DEDUP,
    after_members=True,
    forceable=True,
    gpu=True,
    config=("detect",),
    home=__name__,
)
