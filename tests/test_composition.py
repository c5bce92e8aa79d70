"""The pipeline in a user's code location: `build_definitions` merges with the user's own
definitions under a prefix and a group, with the settings and the executor it is given; the
repository is a `dg` project; a user's `dg` project built with the factory, and another with the
Component written by `dg scaffold defs`, each with an asset that loads `dataset`, pass `dg check
defs`, list their assets and materialize (the `dg` commands run as subprocesses)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import yaml

from dataminer_dagster.definitions import build_definitions
from dataminer_dagster.outputs import Dataset, projects_partitions
from dataminer_dagster.settings import load_settings
from dataminer_dagster.testing import run_projects

PIPELINE_ASSETS = [
    "dataset",
    "dataset_config",
    "deduped_set",
    "deduped_set_config",
    "detections",
    "detections_config",
    "downloads",
    "filtered_frames",
    "frames",
    "frames_backup",
    "video_catalog",
    "video_catalog_config",
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
        dg.AssetKey(["dm", "detections"]),
        dg.AssetKey(["dm", "dataset_config"]),
    }
    assert graph.get(dg.AssetKey("image_count")).parent_keys == {dg.AssetKey(["dm", "dataset"])}
    jobs = sorted(j.name for j in repository.get_all_jobs() if not j.name.startswith("__"))
    assert jobs == [
        f"dm_{lane}_job" for lane in ("backup", "catalog", "filter", "project", "video")
    ]
    assert sorted(s.name for s in repository.sensor_defs) == [
        "dm_lease_reaper",
        "dm_refresh_sources",
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


# --- `dg`: the repository as a project, and two users' code locations ---------------------------

REPO = Path(__file__).resolve().parents[1]
DG = Path(sys.executable).parent / "dg"
ENTRY_POINT_GROUP = "dagster_dg_cli.registry_modules"  # dagster_dg_core/context.py in 1.13.27

FACTORY_LOCATION = """
import dagster as dg

from dataminer_dagster.definitions import build_definitions
from dataminer_dagster.outputs import Dataset, projects_partitions


@dg.asset(partitions_def=projects_partitions, ins={"dataset": dg.AssetIn(key=["dm", "dataset"])})
def image_count(dataset: Dataset) -> int:
    return len(dataset.read_manifest())


defs = dg.Definitions.merge(build_definitions(prefix="dm"), dg.Definitions(assets=[image_count]))
"""

DEFS_FOLDER_LOCATION = """
from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
"""

COMPONENT_USERS_ASSET = """
import dagster as dg

from dataminer_dagster.outputs import Dataset, projects_partitions


@dg.asset(
    partitions_def=projects_partitions,
    ins={"dataset": dg.AssetIn(key=["dataminer", "dataset"])},
)
def image_count(dataset: Dataset) -> int:
    return len(dataset.read_manifest())
"""


def _dg_project(root: Path, module: str, files: dict[str, str]) -> Path:
    """A user's `dg` project: pyproject.toml with [tool.dg] and the package `module`."""
    (root / module).mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{module.replace("_", "-")}"\nversion = "0.1.0"\n\n'
        f'[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "{module}"\n'
    )
    (root / module / "__init__.py").write_text("")
    for name, text in files.items():
        (root / module / name).parent.mkdir(parents=True, exist_ok=True)
        (root / module / name).write_text(text.lstrip())
    return root


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> list[Path]:
    """Where this checkout's package metadata is: nothing to add when the environment's install
    registers the `dg` entry point of pyproject.toml; otherwise (an install older than it) a
    dist-info with the entry points pyproject.toml declares, as `pip install -e .` writes them."""
    import importlib.metadata
    import tomllib

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    modules = {e.value for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    if set(declared[ENTRY_POINT_GROUP].values()) <= modules:
        return []
    site = tmp_path_factory.mktemp("site")
    info = site / "dataminer_dagster-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: dataminer-dagster\nVersion: 0.1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items())
            for group, points in declared.items()
        )
    )
    return [site]


def _dg(args: list[str], cwd: Path, installed: list[Path], **env: str) -> str:
    path = [*map(str, installed), str(REPO), os.environ.get("PYTHONPATH", "")]
    completed = subprocess.run(
        [str(DG), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"dg {' '.join(args)}:\n{output[-4000:]}"
    assert "SupersessionWarning" not in output
    return completed.stdout


def _listed(project: Path, installed: list[Path]) -> dict[str, list[str]]:
    listed = json.loads(_dg(["list", "defs", "--json"], project, installed))
    return {
        "assets": sorted(a["asset_key"] for a in listed["assets"]),
        "jobs": sorted(j["name"] for j in listed["jobs"]),
        "sensors": sorted(s["name"] for s in listed["sensors"]),
    }


def test_the_repository_is_a_dg_project(dataminer_env, installed):
    output = _dg(["check", "defs"], REPO, installed)
    assert "All definitions loaded successfully" in output
    listed = _listed(REPO, installed)
    assert listed["assets"] == PIPELINE_ASSETS
    assert "work" in listed["sensors"] and "project_job" in listed["jobs"]


def test_dg_launch_materializes_an_asset_of_the_repository(
    dataminer_project, installed, tmp_path, monkeypatch
):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # Dagster's default storage, in tmp_path
    (tmp_path / "dagster.yaml").write_text("")
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(projects_partitions.name, [dataminer_project.name])
    _dg(
        ["launch", "--assets", "video_catalog", "--partition", dataminer_project.name],
        REPO,
        installed,
    )
    with dg.DagsterInstance.get() as instance:
        done = instance.get_materialized_partitions(dg.AssetKey("video_catalog"))
    assert done == {dataminer_project.name}


def _materialize_downstream(defs: dg.Definitions, project: str, instance, prefix: str) -> int:
    """Run the pipeline over `project` with the location's jobs, then the user's asset."""
    run = run_projects(defs, [project], instance=instance, prefix=prefix)
    assert run.stages == {project: "complete"}, run
    result = dg.materialize(
        defs.assets,
        selection=[dg.AssetKey("image_count")],
        partition_key=project,
        instance=instance,
        resources=defs.resources,
    )
    return result.output_for_node("image_count")


def test_a_code_location_built_with_the_factory(
    dataminer_project, dataminer_instance, installed, tmp_path
):
    project = _dg_project(
        tmp_path / "factory_user", "factory_user", {"definitions.py": FACTORY_LOCATION}
    )
    assert "All definitions loaded successfully" in _dg(["check", "defs"], project, installed)
    listed = _listed(project, installed)
    assert listed["assets"] == sorted(["image_count", *(f"dm/{a}" for a in PIPELINE_ASSETS)])
    assert "dm_work" in listed["sensors"] and "dm_project_job" in listed["jobs"]

    spec = importlib.util.spec_from_file_location(
        "factory_user_definitions", project / "factory_user" / "definitions.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    images = _materialize_downstream(module.defs, dataminer_project.name, dataminer_instance, "dm")
    manifest = Path(dataminer_project.output_dir) / "dataset" / "manifest.parquet"
    assert images == len(pd.read_parquet(manifest)) > 0


def test_a_code_location_with_the_component(
    dataminer_project, dataminer_instance, installed, tmp_path, monkeypatch
):
    project = _dg_project(
        tmp_path / "component_user",
        "component_user",
        {
            "definitions.py": DEFS_FOLDER_LOCATION,
            "defs/__init__.py": "",
            "defs/image_count.py": COMPONENT_USERS_ASSET,
        },
    )
    components = json.loads(_dg(["list", "components", "--json"], project, installed))
    assert "dataminer_dagster.components.DataminerPipeline" in {
        c["key"] for c in components["items"]
    }
    _dg(
        ["scaffold", "defs", "dataminer_dagster.components.DataminerPipeline", "mining"],
        project,
        installed,
    )
    mining = project / "component_user" / "defs" / "mining"
    written = yaml.safe_load((mining / "defs.yaml").read_text())
    assert written == {
        "type": "dataminer_dagster.components.DataminerPipeline",
        "attributes": {
            "prefix": "dataminer",
            "group": None,
            "settings_file": None,
            "executor": None,
        },
    }
    # A settings file beside defs.yaml, named relative to it.
    (mining / "settings.yaml").write_text("lanes:\n  video:\n    batch: 5\n")
    written["attributes"]["settings_file"] = "settings.yaml"
    (mining / "defs.yaml").write_text(yaml.safe_dump(written, sort_keys=False))

    assert "All definitions loaded successfully" in _dg(["check", "defs"], project, installed)
    listed = _listed(project, installed)
    assert listed["assets"] == sorted(["image_count", *(f"dataminer/{a}" for a in PIPELINE_ASSETS)])
    assert "dataminer_work" in listed["sensors"]

    monkeypatch.syspath_prepend(str(project))
    defs = dg.load_from_defs_folder(project_root=project)
    assert defs.resources["db"].settings.lanes["video"].batch == 5
    images = _materialize_downstream(defs, dataminer_project.name, dataminer_instance, "dataminer")
    manifest = Path(dataminer_project.output_dir) / "dataset" / "manifest.parquet"
    assert images == len(pd.read_parquet(manifest)) > 0
