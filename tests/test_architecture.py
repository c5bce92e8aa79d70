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
PKG = "dataminer_dagster."

# The layers, bottom up: a module imports modules of its own layer and of the layers below, never
# of one above (imports inside functions and `if TYPE_CHECKING:` blocks count too). Each
# top-level module or package of dataminer_dagster is in exactly one layer; a stage folder's
# modules are split between the stage definitions (its registry entry, its config section, its
# algorithm) and the stages (its asset, its table and SQL, its quality checks).
LAYERS = (
    ("vocabulary", ("core", "registry", "partitions", "tags", "settings", "paths")),
    ("clients", ("acquisition", "models")),
    ("stage definitions", ("assets", "config", "outputs", "lanes")),
    ("database", ("db",)),
    ("resources", ("resources",)),
    ("engine", ("engine",)),
    ("stages", ()),
    ("sensors", ("sensors",)),
    ("root", ("definitions", "components", "testing", "demo", "cli", "hosting")),
)
LAYER_NAMES = [name for name, _ in LAYERS]
# A stage folder's modules that are the stage's Dagster asset, its table and its SQL.
STAGE_CODE = ("asset", "table", "store", "quality_checks")
# A stage folder's modules that face Dagster or the database (above), its registry entry and its
# config section; every other module of the folder is the stage's algorithm.
STAGE_FACING = ("__init__", "config", *STAGE_CODE)
PURE_FORBIDS = ("dagster", "sqlalchemy")


def _imports(path: Path, *, type_checking: bool = True) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (`if TYPE_CHECKING:` blocks included unless
    `type_checking` is false: those are for type checkers only)."""
    tree = ast.parse(path.read_text())
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if (
            not type_checking
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
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
    """(stage folder, module) of a stage folder's module, e.g. ("filter", "table")."""
    parts = module.split(".")
    if parts[:2] == ["dataminer_dagster", "assets"] and len(parts) >= 4:
        return parts[2], parts[3]
    return None


def _layer(module: str) -> int | None:
    """The layer of a module of the package (None: not the package's)."""
    parts = module.split(".")
    if parts[0] != "dataminer_dagster":
        return None
    if len(parts) == 1:
        return 0
    stage = _stage_of(module)
    if stage and stage[1] in STAGE_CODE:
        return LAYER_NAMES.index("stages")
    for number, (_, tops) in enumerate(LAYERS):
        if parts[1] in tops:
            return number
    raise AssertionError(f"{module} is in no layer: place its top-level part in LAYERS")


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    return ".".join(path.relative_to(package.parent).with_suffix("").parts)


def _upward(importer: str, module: str) -> bool:
    mine, theirs = _layer(importer), _layer(module)
    return mine is not None and theirs is not None and theirs > mine


def _modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "_migrations" not in p.parts)


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """Every import of a module from a layer above the importer's, as `importer -> module`."""
    return [
        f"{_module_name(path, package)}:{line} ({LAYER_NAMES[_layer(_module_name(path, package))]})"
        f" -> {module} ({LAYER_NAMES[_layer(module)]})"
        for path in _modules(package)
        for line, module in _imports(path)
        if _upward(_module_name(path, package), module)
    ]


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """The groups of modules that import each other, round a loop (any import counts)."""
    names = {_module_name(p, package).removesuffix(".__init__"): p for p in _modules(package)}

    def resolve(module: str) -> str | None:
        while module and module not in names:
            module = module.rpartition(".")[0]
        return module or None

    edges = {
        name: {r for _, m in _imports(path) if (r := resolve(m)) and r != name}
        for name, path in names.items()
    }
    return _cycles(edges)


def test_no_module_imports_from_a_layer_above_its_own():
    wrong = upward_imports()
    assert not wrong, "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_also_not_through_type_checking():
    assert import_cycles() == []


@pytest.mark.parametrize(
    ("part", "forbidden"),
    [
        ("core", (*PURE_FORBIDS, PKG)),  # and nothing of the package but core
        ("models", PURE_FORBIDS),
        ("db", ("dagster",)),
        ("acquisition", ("dagster",)),
        # Runtime imports: the definitions and the sensors' code server load without torch.
        ("engine", HEAVY),
        ("resources", HEAVY),
        (
            "sensors",
            (*HEAVY, *(PKG + f"engine.{m}" for m in ("stage", "stage_asset", "stage_run"))),
        ),
    ],
)
def test_a_part_makes_none_of_the_imports_its_role_forbids(part, forbidden):
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in sorted((PACKAGE / part).rglob("*.py"))
        for line, module in _imports(path, type_checking=False)
        if any(module == f or module.startswith(f.rstrip(".") + ".") for f in forbidden)
        and not (part == "core" and module.startswith(PKG + "core"))
    ]
    assert not wrong, "\n".join(wrong)


def _algorithm_modules() -> list[Path]:
    return sorted(
        path for path in (PACKAGE / "assets").glob("*/*.py") if path.stem not in STAGE_FACING
    )


@pytest.mark.parametrize("path", _algorithm_modules(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_stages_algorithm_is_pure(path):
    """Beside its asset, a stage keeps its algorithm (sampling, grouping, formats): plain Python
    that knows nothing of Dagster or SQL (the layers keep it off the database and the engine)."""
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for line, module in _imports(path)
        if any(module == f or module.startswith(f + ".") for f in PURE_FORBIDS)
    ]
    assert not wrong, "\n".join(wrong)


def test_a_stage_never_imports_another_stages_asset_and_the_registry_entries_stay_light():
    """A stage reads another stage's table (and model) through its modules, never its asset; the
    registry's modules (the package and each folder's entry) import nothing but the registry."""
    wrong = []
    for path in sorted((PACKAGE / "assets").rglob("*.py")):
        importer = _module_name(path)
        mine = _stage_of(importer)
        for line, module in _imports(path):
            theirs = _stage_of(module)
            if theirs and theirs[1] == "asset" and (mine is None or mine[0] != theirs[0]):
                wrong.append(f"{importer}:{line} imports {module}")
            entry = importer.count(".") <= 3 and importer.endswith("__init__")
            if (
                entry
                and module.startswith(PKG)
                and not (module.startswith(PKG + "assets") or module == PKG + "registry")
            ):
                wrong.append(f"{importer}:{line} imports {module}")
            if entry and module.split(".")[0] in HEAVY:
                wrong.append(f"{importer}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def inherited_across_modules(package: Path = PACKAGE, part: str = "db") -> list[str]:
    """Every class of these files whose base is a class of another module of the package, as
    `module:line Class(Base from module)`. An exception may extend another module's exception
    (the error its callers catch), and a class may implement an interface of another module: a
    `typing.Protocol`, or an abstract class (one with abstract methods, such as acquisition's
    `HostThrottle`, whose shared throttle lives in db/): neither spreads one class's code over
    two files."""
    import importlib
    import inspect
    import typing

    wrong = []
    for path in sorted((package / part).rglob("*.py")):
        own = _module_name(path, package).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name: f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            if node.module.startswith(PKG) and node.module != own
            for alias in node.names
        }
        imported |= {
            alias.asname or alias.name.rpartition(".")[2]: alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
            if alias.name.startswith(PKG) and alias.name != own
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                parts = ast.unparse(base).split(".")
                if parts[0] not in imported:
                    continue
                module, _, name = ".".join([imported[parts[0]], *parts[1:]]).rpartition(".")
                try:
                    found = getattr(importlib.import_module(module), name)
                except ImportError:  # the name is a module: `from package import module`
                    found = importlib.import_module(f"{module}.{name}")
                if isinstance(found, type) and (
                    issubclass(found, BaseException)
                    or typing.Protocol in found.__mro__
                    or inspect.isabstract(found)
                ):
                    continue
                wrong.append(f"{own}:{node.lineno} {node.name}({name} from {module})")
    return wrong


def test_a_database_class_is_composed_in_its_own_file_never_inherited_across_files():
    """A db class is read in one file: one that needs another module's class holds it (the
    lease store holds its `liveness`, the catalog its `projects`, `videos` and `frames`), it
    does not extend it."""
    wrong = inherited_across_modules()
    assert not wrong, "\n".join(wrong)


def test_the_rules_can_fail(tmp_path):
    """The checks themselves: a forbidden import inside a function is found, layers are ordered,
    a cycle is seen, and a class extending another module's class (an exception aside) too."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
        "def f():\n    import dagster\n    from dataminer_dagster.db import leases\n"
    )
    assert [m for _, m in _imports(sample)] == [
        "typing",
        "torch",
        "dagster",
        "dataminer_dagster.db",
    ]
    assert "torch" not in [m for _, m in _imports(sample, type_checking=False)]
    assert _upward("dataminer_dagster.db.leases", "dataminer_dagster.engine.stage")
    assert _upward("dataminer_dagster.db.reports", "dataminer_dagster.assets.filter.table")
    assert not _upward("dataminer_dagster.db.reports", "dataminer_dagster.assets")
    assert not _upward("dataminer_dagster.assets.filter.asset", "dataminer_dagster.engine.stage")
    assert _upward("dataminer_dagster.acquisition.inputs", "dataminer_dagster.config")
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    (tmp_path / "dataminer_dagster" / "db").mkdir(parents=True)
    (tmp_path / "dataminer_dagster" / "db" / "sample.py").write_text(
        "from dataminer_dagster.db.leases import LeaseLost, LeaseStore\n"
        "from dataminer_dagster.db import catalog\n"
        "class A(LeaseStore): ...\nclass B(LeaseLost): ...\nclass C(catalog.Catalog): ...\n"
    )
    assert inherited_across_modules(tmp_path / "dataminer_dagster") == [
        "dataminer_dagster.db.sample:3 A(LeaseStore from dataminer_dagster.db.leases)",
        "dataminer_dagster.db.sample:5 C(Catalog from dataminer_dagster.db.catalog)",
    ]


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
        heavy = [m for m in ("torch", "transformers", "ultralytics", "faiss", "pandas")
                 if m in sys.modules]
        print(f"{type(defs.executor).__name__}|{','.join(sensors)}|{','.join(assets)}|{heavy}")
        """,
        env={"DATAMINER_EXECUTOR": executor},
    )
    _, sensors, assets, heavy = summary.split("|")
    # Every run worker and code server loads them: a model library or pandas, among the slowest
    # imports, waits for the stage that needs it.
    assert heavy == "[]", "loading the definitions imported a model library or pandas"
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
