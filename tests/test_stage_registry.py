"""A new stage is one folder: its registry entry and its asset. This file writes a project stage
of its own as a folder (`summary`, after the dataset) and drives a project through it with the sensors' decisions. Nothing
in the package names it; the project chain, the lanes, the status board, `force` and the lease
statements pick it up from the registry."""

from __future__ import annotations

import importlib
import json
import sys

import dagster as dg
import pandas as pd
import pytest

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.assets.dataset.dataset_files import MANIFEST_FILE
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_lifecycle import force_stage
from dataminer_dagster.db.reports import stage_counts
from dataminer_dagster.lanes import DEFAULT_LANES
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.registry import DATASET, PROJECTS, StageSpec
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.pipeline import (
    drive_quietly,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow

SUMMARY = "summary"

# The stage's folder, as a user writes it: its registry entry, and its asset.
SUMMARY_ENTRY = """
from dataminer_dagster.registry import DATASET, PROJECTS, StageSpec

STAGE = StageSpec(
    "summary",
    PROJECTS,
    lane="project",
    asset="dataset_summary",
    description="summarise the dataset",
    reads=DATASET,
    after_members=True,
    forceable=True,
    home=__name__,
)
"""
SUMMARY_ASSET = """
import json

import pandas as pd

from dataminer_dagster.assets.dataset.dataset_files import MANIFEST_FILE
from dataminer_dagster.engine.stage import StageContext, StageItem
from dataminer_dagster.engine.stage_asset import stage_asset
from dataminer_dagster.engine.outcomes import ItemResult
from dataminer_dagster.paths import ProjectPaths


@stage_asset(stage="summary")
def dataset_summary(item: StageItem, ctx: StageContext) -> ItemResult:
    \"\"\"A JSON summary beside the project's dataset: images per video.\"\"\"
    project = ctx.catalog.projects.get(item.key)
    dataset = ProjectPaths(project.output_dir).dataset_dir
    manifest = pd.read_parquet(dataset / MANIFEST_FILE)
    per_video = {str(k): int(v) for k, v in manifest.groupby("video_id").size().items()}
    target = dataset.parent / "summary.json"
    return ItemResult(
        metadata={"videos": len(per_video)},
        outcome={"images": len(manifest)},
        commit=lambda conn: target.write_text(json.dumps(per_video)),
    )
"""


@pytest.fixture
def summary_stage(tmp_path, monkeypatch):
    """A stage folder `summary_stage/` of the test's own, registered after `dataset` for this test
    only."""
    folder = tmp_path / "stages" / "summary_stage"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(SUMMARY_ENTRY)
    (folder / "asset.py").write_text(SUMMARY_ASSET)
    monkeypatch.syspath_prepend(str(folder.parent))
    entry = importlib.import_module("summary_stage")
    REGISTRY.add(entry.STAGE, after=DATASET)
    try:
        yield
    finally:
        REGISTRY.remove(SUMMARY)
        for name in ("summary_stage.asset", "summary_stage"):
            sys.modules.pop(name, None)


def _definitions(resources: dict) -> dg.Definitions:
    """Definitions built the way definitions.py builds them, from the registry as it is now."""
    from dataminer_dagster.engine.assembly import pipeline_assets, stage_assets
    from dataminer_dagster.engine.jobs import lane_jobs

    stages = stage_assets()
    return dg.Definitions(
        assets=pipeline_assets(stages),
        jobs=list(lane_jobs(stages, DEFAULT_LANES).values()),
        resources=resources,
        executor=dg.in_process_executor,
    )


def test_a_stage_added_as_a_folder_runs_in_the_project_chain(
    summary_stage, tmp_path, database_url, engine, tiny_siglip
):
    assert REGISTRY.project_chain == ("dedup", "detect", "dataset", SUMMARY)
    assert [lane.stages for lane in DEFAULT_LANES if lane.name == "project"] == [
        ("dedup", "detect", "dataset", SUMMARY)
    ]
    clips = write_videos(
        tmp_path / "videos",
        {
            f"clip{i}.mp4": SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.0, seed=i)
            for i in range(2)
        },
    )
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    config = parse_project_config(
        {
            "name": "p",
            "output_dir": str(tmp_path / "out" / "p"),
            "inputs": {"files": [str(p) for p in clips.values()]},
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(tiny_siglip, ["a"]),
        }
    )
    catalog.projects.register(config)
    defs = _definitions(resources(database_url, data_dir))
    with instance_for_test() as instance:
        result = drive_quietly(["p"], instance=instance, defs=defs, store=store)
        assert result.stages == {"p": "complete"}
        summary = work_items(engine, SUMMARY)["p"]
        assert summary.status == "done"
        written = json.loads((tmp_path / "out" / "p" / "summary.json").read_text())
        manifest = pd.read_parquet(ProjectPaths(tmp_path / "out" / "p").dataset_dir / MANIFEST_FILE)
        assert sum(written.values()) == len(manifest) == summary.outcome["images"] > 0
        # The status board counts it like any other project stage.
        assert stage_counts(engine, catalog.projects.get("p").id)[SUMMARY]["done"] == 1

        # Forcing it (what `dataminer force-summary` does) runs it again, and only it.
        forced = force_stage(catalog, "p", SUMMARY)
        assert forced.previous_stage == "complete" and not forced.earlier_not_done
        assert catalog.projects.get("p").stage == SUMMARY
        dataset_done = work_items(engine, DATASET)["p"].finished_at
        again = drive_quietly(["p"], instance=instance, defs=defs, store=store)
        assert again.stages == {"p": "complete"}
        assert work_items(engine, SUMMARY)["p"].attempts == 1  # fresh item, one attempt
        assert work_items(engine, DATASET)["p"].finished_at == dataset_done


def test_the_registry_refuses_what_would_break_the_flow():
    spec = StageSpec("x", PROJECTS, "no-such-lane", "x_asset", "x", home="x")
    with pytest.raises(ValueError, match="no lane 'no-such-lane'"):
        REGISTRY.add(spec, after=DATASET)
    reads_later = StageSpec("x", PROJECTS, "project", "x_asset", "x", home="x", reads="backup")
    with pytest.raises(ValueError, match="reads 'backup', which comes after it"):
        REGISTRY.add(reads_later, after=DATASET)
    with pytest.raises(ValueError, match="registered already"):
        REGISTRY.add(REGISTRY[DATASET], after=DATASET)
    with pytest.raises(KeyError, match="no stage 'nope'"):
        REGISTRY["nope"]
    assert "x" not in REGISTRY.names


def test_the_lanes_are_the_ones_the_registry_names():
    """A stage names its lane from the registry's vocabulary; each has its job (lanes.py)."""
    from dataminer_dagster.lanes import DEFAULT_LANES
    from dataminer_dagster.registry import LANE_NAMES

    assert tuple(lane.name for lane in DEFAULT_LANES) == LANE_NAMES
    assert {spec.lane for spec in REGISTRY.specs} <= set(LANE_NAMES)
