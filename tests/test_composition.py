"""The pipeline in a user's code location: `build_definitions` merges with the user's own
definitions under a prefix and a group, with the settings and the executor it is given."""

from __future__ import annotations

import dagster as dg
import pytest

from dataminer_dagster.definitions import build_definitions
from dataminer_dagster.outputs import Dataset, projects_partitions
from dataminer_dagster.settings import load_settings

PIPELINE_ASSETS = [
    "dataset",
    "deduped_set",
    "detections",
    "downloads",
    "filtered_frames",
    "frames",
    "frames_backup",
    "video_catalog",
]


@dg.asset(name="dataset")  # a user's asset of the same name as one of the pipeline's
def users_dataset() -> None: ...


@dg.asset(partitions_def=projects_partitions, ins={"dataset": dg.AssetIn(key=["dm", "dataset"])})
def image_count(dataset: Dataset) -> int:
    return dataset.images


def test_a_prefixed_pipeline_merges_with_a_users_assets_of_the_same_names(dataminer_env):
    pipeline = build_definitions(prefix="dm", group="mining")
    defs = dg.Definitions.merge(pipeline, dg.Definitions(assets=[users_dataset, image_count]))
    dg.Definitions.validate_loadable(defs)
    repository = defs.get_repository_def()
    graph = repository.asset_graph
    keys = sorted(k.to_user_string() for k in graph.get_all_asset_keys())
    assert keys == sorted(["dataset", "image_count", *(f"dm/{a}" for a in PIPELINE_ASSETS)])
    assert {graph.get(dg.AssetKey(["dm", a])).group_name for a in PIPELINE_ASSETS} == {"mining"}
    assert graph.get(dg.AssetKey(["dm", "dataset"])).parent_keys == {
        dg.AssetKey(["dm", "detections"])
    }
    assert graph.get(dg.AssetKey("image_count")).parent_keys == {dg.AssetKey(["dm", "dataset"])}
    jobs = sorted(j.name for j in repository.get_all_jobs() if not j.name.startswith("__"))
    assert jobs == [
        f"dm_{lane}_job" for lane in ("backup", "catalog", "filter", "project", "video")
    ]
    assert sorted(s.name for s in repository.sensor_defs) == [
        "dm_lease_reaper",
        "dm_release_cancelled_runs",
        "dm_release_failed_runs",
        "dm_work",
    ]
    nodes = {node.name for job in repository.get_all_jobs() for node in job.graph.node_defs}
    assert {"dm_video_lane", "dm_project_lane"} <= nodes


def test_the_factory_takes_its_settings_and_executor(dataminer_env, tmp_path):
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("lanes:\n  video:\n    batch: 7\nsensors:\n  work_interval_s: 9\n")
    defs = build_definitions(settings=settings_file, executor="multiprocess")
    assert defs.executor.name == "multiprocess"
    repository = defs.get_repository_def()
    assert repository.get_job("video_job").executor_def.name == "multiprocess"
    assert repository.get_sensor_def("work").minimum_interval_seconds == 9
    db = defs.resources["db"]
    assert db.settings_file == str(settings_file)
    assert db.settings.lanes["video"].batch == 7 and load_settings().lanes == {}

    assert build_definitions(executor=dg.in_process_executor).executor is dg.in_process_executor
    with pytest.raises(ValueError, match="expected one of in_process, multiprocess, celery"):
        build_definitions(executor="threads")
    with pytest.raises(ValueError, match="letters, digits and underscores"):
        build_definitions(prefix="my-pipeline")
