"""Layout figures of the package: modules holding SQL text, modules over 500 lines, file names
used by more than one module (a stage folder's own files, `assets/<stage>/asset.py` and the like,
mean one thing each and are not counted), imports from a lower layer to a higher one and import
cycles (the layers of tests/test_architecture.py), modules that name a stage outside the stage
folders and the registry, and the lines and modules of core/ and of each stage folder.

    python bench/layout.py [--package PATH]

`--package` measures another checkout's package, e.g. an older commit's
(`git worktree add /tmp/old REV && python bench/layout.py --package /tmp/old/dataminer_dagster`).
"""

from __future__ import annotations

import argparse
import ast
import collections
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dataminer_dagster"
sys.path.insert(0, str(PACKAGE.parent))  # tests.test_architecture: the layers

from tests.test_architecture import import_cycles, upward_imports  # noqa: E402

STAGE_NAMES = {"CATALOG", "DOWNLOAD", "FRAMES", "FILTER", "DEDUP", "DETECT", "DATASET", "BACKUP"}
# A statement's opening words inside a string literal: what a module holding SQL text has.
SQL = re.compile(
    r"""(['"]|^)\s*(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH|CREATE|ALTER|DROP)\s""",
    re.MULTILINE,
)


# The files every stage folder may have, one meaning each (assets/<stage>/asset.py is always
# that stage's asset): not counted as names used twice.
STAGE_FILES = ("asset.py", "config.py", "table.py", "store.py")


def _stage_convention(path: Path, package: Path) -> bool:
    parts = path.relative_to(package).parts
    return len(parts) == 3 and parts[0] == "assets" and parts[2] in STAGE_FILES


def figures(package: Path = PACKAGE) -> dict[str, list[str]]:
    modules = sorted(p for p in package.rglob("*.py") if "_migrations" not in p.parts)
    names = collections.defaultdict(list)
    for path in modules:
        if path.name != "__init__.py" and not _stage_convention(path, package):
            names[path.name].append(str(path.relative_to(package)))
    return {
        "modules holding SQL text": [
            str(p.relative_to(package)) for p in modules if SQL.search(p.read_text())
        ],
        "modules over 500 lines": [
            f"{p.relative_to(package)} ({n})"
            for p in modules
            if (n := len(p.read_text().splitlines())) > 500
        ],
        "file names used more than once": [
            f"{name}: {', '.join(paths)}" for name, paths in sorted(names.items()) if len(paths) > 1
        ],
        "imports from a lower layer to a higher one": upward_imports(package),
        "import cycles": [" <-> ".join(cycle) for cycle in import_cycles(package)],
        "modules naming a stage outside the stage folders and the registry": [
            f"{p.relative_to(package)} ({', '.join(named)})"
            for p in modules
            if (named := _stage_names(p, package))
        ],
        "lines of core/ and of each stage folder": [
            f"{folder.relative_to(package)}: {len(files)} modules, "
            f"{sum(len(f.read_text().splitlines()) for f in files)} lines"
            for folder in [package / "core", *sorted((package / "assets").glob("*/"))]
            if (files := sorted(folder.glob("*.py")))
        ],
    }


def _stage_names(path: Path, package: Path) -> list[str]:
    """The stage names a module outside the stage folders and the registry imports."""
    relative = path.relative_to(package).as_posix()
    if relative.startswith("assets/") or relative.endswith("registry.py"):
        return []
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("registry"):
            named |= {alias.name for alias in node.names} & STAGE_NAMES
    return sorted(named)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=PACKAGE)
    args = parser.parse_args()
    for title, rows in figures(args.package.resolve()).items():
        print(f"{title}: {len(rows)}")
        for row in rows:
            print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
