"""Testing your own assets beside the pipeline (docs/extending.md's example, word for word)."""

import dagster as dg

from dataminer_dagster.definitions import build_definitions
from dataminer_dagster.outputs import Dataset, projects_partitions
from dataminer_dagster.testing import run_projects


@dg.asset(partitions_def=projects_partitions, ins={"dataset": dg.AssetIn(key=["dm", "dataset"])})
def image_count(dataset: Dataset) -> int:
    """A user's asset downstream of the pipeline: one value per project."""
    return len(dataset.read_manifest())


def my_definitions() -> dg.Definitions:
    """The user's code location: the pipeline under the prefix `dm`, and their own asset."""
    return dg.Definitions.merge(
        build_definitions(prefix="dm"), dg.Definitions(assets=[image_count])
    )


def test_the_work_sensor_requests_the_catalog_run(dataminer_project, dataminer_instance):
    defs = my_definitions()
    with dg.build_sensor_context(
        instance=dataminer_instance, resources={"db": defs.resources["db"]}
    ) as context:
        result = defs.resolve_sensor_def("dm_work")(context)
    (request,) = result.run_requests
    assert request.job_name == "dm_catalog_job"
    assert request.tags["dagster/asset_partition_range_start"] == dataminer_project.name


def test_materialize_one_asset(dataminer_project, dataminer_instance):
    defs = my_definitions()
    result = dg.materialize(
        defs.assets,
        selection=[dg.AssetKey(["dm", "video_catalog"])],
        partition_key=dataminer_project.name,
        instance=dataminer_instance,
        resources=defs.resources,
    )
    (event,) = result.get_asset_materialization_events()
    assert event.asset_key == dg.AssetKey(["dm", "video_catalog"])


def test_my_asset_loads_the_dataset(dataminer_project, dataminer_instance):
    defs = my_definitions()
    run = run_projects(defs, [dataminer_project.name], instance=dataminer_instance, prefix="dm")
    assert run.stages == {dataminer_project.name: "complete"}

    result = dg.materialize(
        defs.assets,
        selection=[image_count],
        partition_key=dataminer_project.name,
        instance=dataminer_instance,
        resources=defs.resources,
    )
    assert result.output_for_node("image_count") > 0
