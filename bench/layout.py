"""Layout figures of the package (issue 22): modules holding SQL text, modules over 500 lines,
file names used by more than one module (a stage folder's own files, `assets/<stage>/asset.py` and
the like, mean one thing each and are not counted). Run: `python bench/layout.py`."""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dataminer_dagster"
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
    }


def main() -> int:
    for title, rows in figures().items():
        print(f"{title}: {len(rows)}")
        for row in rows:
            print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
