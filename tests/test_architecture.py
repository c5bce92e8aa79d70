"""The parts of the package and the arrows between them (docs/architecture.md, "The parts"), and
the real Definitions: they load and validate as `dagster dev` loads them."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dataminer_dagster"
HEAVY = ("torch", "transformers", "ultralytics", "faiss")
ROOT_SIDE = ("cli", "hosting", "definitions", "demo", "components", "testing")
PKG = "dataminer_dagster."
# A stage's code: every module of a stage folder but its registry entry (the folder's package)
# and its config section, which the project config composes.
STAGE_CODE = ("asset", "table", "store")

# part -> imports it must not make (prefixes of module names); `if TYPE_CHECKING:` blocks are
# for type checkers only and do not count. Stage code (STAGE_CODE) is checked apart (`_breaks`).
FORBIDDEN = {
    "core": ("dagster", "sqlalchemy", PKG),  # but dataminer_dagster.core
    "models": (
        "dagster",
        "sqlalchemy",
        *(PKG + p for p in ("db", "resources", "sensors", "engine", "assets", *ROOT_SIDE)),
    ),
    "db": (
        "dagster",
        *(PKG + p for p in ("models", "resources", "sensors", "engine.", *ROOT_SIDE)),
    ),
    "acquisition": (
        "dagster",
        *(PKG + p for p in ("models", "resources", "sensors", "engine.", *ROOT_SIDE)),
    ),
    "engine": (*HEAVY, *(PKG + p for p in ("models", "sensors", *ROOT_SIDE))),
    "sensors": (
        *HEAVY,
        *(
            PKG + p
            for p in (
                "models",
                "engine.stage",
                "engine.stage_asset",
                "engine.stage_run",
                *ROOT_SIDE,
            )
        ),
    ),
    # The models resource loads models/ inside its methods: definitions load without torch.
    "resources": (
        *HEAVY,
        *(
            PKG + p
            for p in (
                "sensors",
                "engine.stage",
                "engine.stage_asset",
                "engine.stage_run",
                *ROOT_SIDE,
            )
        ),
    ),
    "assets": tuple(PKG + p for p in ("sensors", *ROOT_SIDE)),
}
# What the lower parts may take from the engine: the registry's types and names.
ENGINE_FOR_ALL = (PKG + "registry",)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth, outside `if TYPE_CHECKING:` blocks."""
    tree = ast.parse(path.read_text())
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _stage_of(module: str) -> tuple[str, str] | None:
    """(stage folder, module) of a stage's code, e.g. ("filter", "table"); None otherwise."""
    parts = module.split(".")
    if parts[:2] == ["dataminer_dagster", "assets"] and len(parts) >= 4:
        return parts[2], parts[3]
    return None


def _breaks(part: str, module: str, importer: str = "") -> bool:
    """Whether `importer` (a module of `part`) may not import `module`."""
    if part == "core" and module.startswith(PKG + "core"):
        return False
    if module in ENGINE_FOR_ALL:
        return False
    stage = _stage_of(module)
    if stage and stage[1] in STAGE_CODE:
        mine = _stage_of(importer)
        if part != "assets":  # below the stages: no stage's code at all
            return True
        # A stage reads another stage's table (and model) through its modules, never its asset.
        return stage[1] == "asset" and (mine is None or mine[0] != stage[0])
    if part == "assets" and importer.count(".") <= 3 and importer.endswith("__init__"):
        # The registry's modules (the package and the folders' entries) stay light.
        return not (module.startswith(PKG + "assets") or module in ENGINE_FOR_ALL)
    return any(
        module == f
        or module.startswith(f.rstrip(".") + ".")
        or (f.endswith(".") and module.startswith(f))
        for f in FORBIDDEN[part]
    )


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_each_part_imports_only_what_its_arrows_allow(part):
    files = sorted((PACKAGE / part).rglob("*.py"))
    assert files, part
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in files
        for line, module in _imports(path)
        if _breaks(part, module, _module_name(path))
    ]
    assert not wrong, "\n".join(wrong)


# A stage folder's modules that face Dagster or the database; every other module of the folder is
# the stage's algorithm and, like core/, imports neither.
STAGE_FACING = ("__init__", "asset", "store", "table", "config", "quality_checks")
PURE_FORBIDS = (
    "dagster",
    "sqlalchemy",
    *(PKG + p for p in ("db", "engine", "resources", "sensors", *ROOT_SIDE)),
)


def _algorithm_modules() -> list[Path]:
    return sorted(
        path for path in (PACKAGE / "assets").glob("*/*.py") if path.stem not in STAGE_FACING
    )


@pytest.mark.parametrize("path", _algorithm_modules(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_stages_algorithm_is_pure(path):
    """Beside its asset, a stage keeps its algorithm (sampling, grouping, formats): plain Python
    that knows nothing of Dagster, SQL or the engine, and no stage's asset, table or SQL (a stage's
    config section, plain pydantic, it may read)."""
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for line, module in _imports(path)
        if any(module == f or module.startswith(f + ".") for f in PURE_FORBIDS)
        or (_stage_of(module) or ("", ""))[1] in (*STAGE_CODE, "quality_checks")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_import_it_forbids(tmp_path):
    """The check itself can fail: a forbidden import inside a function is found."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    import dagster\n    from dataminer_dagster.db import leases\n")
    found = [module for _, module in _imports(sample)]
    assert found == ["dagster", "dataminer_dagster.db"]
    assert _breaks("core", "dataminer_dagster.db") and _breaks("core", "dagster")
    assert not _breaks("core", "dataminer_dagster.core.files")
    assert _breaks("sensors", "dataminer_dagster.engine.stage")
    assert _breaks("db", "dataminer_dagster.assets.filter.table")
    assert not _breaks("db", "dataminer_dagster.assets")  # the registry
    dedup = "dataminer_dagster.assets.dedup.asset"
    assert _breaks("assets", "dataminer_dagster.assets.filter.asset", dedup)
    assert not _breaks("assets", "dataminer_dagster.assets.filter.table", dedup)
    assert _breaks("assets", "torch", "dataminer_dagster.assets.filter.__init__")


def _fresh_python(script: str, env: dict[str, str] | None = None) -> str:
    import os

    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.strip().splitlines()[-1]


def test_the_sensors_load_without_any_stage_module_or_model_library():
    loaded = _fresh_python(
        """
        import sys
        import dataminer_dagster.sensors.pipeline_sensors
        print(" ".join(sorted(m for m in sys.modules
                              if (m.startswith("dataminer_dagster.") and m.split(".")[-1]
                                  in ("asset", "table", "store", "stage", "stage_asset", "stage_run"))
                              or m.split(".")[0] in ("torch", "transformers", "ultralytics"))) or "none")
        """
    )
    assert loaded == "none"


def test_the_cli_loads_without_dagster_numpy_or_a_model_library():
    """Every `dataminer` command starts by importing the CLI: `status` at a million videos has
    2 s in all (issue 25), of which numpy alone took 0.15 s. Commands import what they run."""
    loaded = _fresh_python(
        """
        import sys
        import dataminer_dagster.cli
        print(" ".join(sorted(m for m in sys.modules if m.split(".")[0]
                              in ("dagster", "numpy", "cv2", "torch", "transformers", "pandas")))
              or "none")
        """
    )
    assert loaded == "none"


@pytest.mark.parametrize("executor", ["in_process", "multiprocess", "celery"])
def test_the_real_definitions_load_and_validate(dataminer_env, executor):
    summary = _fresh_python(
        """
        import sys
        import dagster as dg
        from dataminer_dagster.definitions import LANES, defs

        dg.Definitions.validate_loadable(defs)
        repository = defs.get_repository_def()
        jobs = sorted(j.name for j in repository.get_all_jobs() if not j.name.startswith("__"))
        assert jobs == sorted(f"{lane.name}_job" for lane in LANES), jobs
        for job in jobs:
            defs.resolve_job_def(job)
        sensors = sorted(s.name for s in repository.sensor_defs)
        assets = sorted(k.to_user_string() for k in repository.asset_graph.get_all_asset_keys())
        heavy = [m for m in ("torch", "transformers", "ultralytics", "faiss") if m in sys.modules]
        print(f"{type(defs.executor).__name__}|{','.join(sensors)}|{','.join(assets)}|{heavy}")
        """,
        env={"DATAMINER_EXECUTOR": executor},
    )
    _, sensors, assets, heavy = summary.split("|")
    assert heavy == "[]", "loading the definitions imported a model library"
    assert sensors == "lease_reaper,refresh_sources,release_cancelled_runs,release_failed_runs,work"
    assert assets == ",".join(
        sorted(
            [
                "dataset",
                "deduped_set",
                "detections",
                "downloads",
                "filtered_frames",
                "frames",
                "frames_backup",
                "video_catalog",
                *(f"{stage}_config" for stage in ("video_catalog", "deduped_set", "detections")),
                "dataset_config",
            ]
        )
    )


def test_the_ui_shows_descriptions_and_the_flow_in_groups(dataminer_env):
    """Every sensor and job says what it does; assets are grouped as the flow goes."""
    import json

    shown = json.loads(
        _fresh_python(
            """
            import json
            from dataminer_dagster.definitions import defs

            repository = defs.get_repository_def()
            graph = repository.asset_graph
            print(json.dumps({
                "sensors": {s.name: s.description for s in repository.sensor_defs},
                "jobs": {j.name: j.description for j in repository.get_all_jobs()
                         if not j.name.startswith("__")},
                "groups": {k.to_user_string(): graph.get(k).group_name
                           for k in graph.get_all_asset_keys()},
            }))
            """
        )
    )
    assert all(shown["sensors"].values()) and all(shown["jobs"].values()), shown
    assert shown["groups"] == {
        "video_catalog": "ingest",
        "downloads": "ingest",
        "frames": "ingest",
        "frames_backup": "ingest",
        "filtered_frames": "curation",
        "deduped_set": "curation",
        "detections": "curation",
        "dataset": "curation",
        # the projects' config assets, beside the stages they feed (engine/config_versions.py)
        "video_catalog_config": "ingest",
        "deduped_set_config": "curation",
        "detections_config": "curation",
        "dataset_config": "curation",
    }


def test_sql_names_the_claim_tables_through_the_one_schema_definition():
    """`{SCHEMA}.<table>` everywhere: a literal `dataminer.<table>` would survive a rename."""
    import re

    from dataminer_dagster.db.schema import SCHEMA, metadata

    tables = "|".join(t.name for t in metadata.tables.values())
    literal = re.compile(rf"\b{SCHEMA}\.({tables})\b")
    found = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in PACKAGE.rglob("*.py")
        if "_migrations" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert found == []
