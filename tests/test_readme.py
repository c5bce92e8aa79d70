"""The README and the documentation site stay true to the code: the config reference is the
schema's, the two commands are the ones CI runs, the examples run, every link resolves."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dataminer_dagster.config import config_reference

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
PAGES = {path.name: path.read_text() for path in sorted(DOCS.glob("*.md"))}


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def test_config_reference_matches_the_schema():
    match = re.search(
        r"<!-- config-reference:start -->\n(.*)\n<!-- config-reference:end -->",
        PAGES["configuration.md"],
        re.S,
    )
    assert match, "docs/configuration.md lost its config-reference markers"
    assert match.group(1) == config_reference(), (
        "regenerate with: python -m dataminer_dagster.config --write docs/configuration.md"
    )


def test_ci_runs_the_readme_test_command():
    demo, tests = bash_blocks(README)[:2]
    assert demo.endswith("dataminer demo")
    assert tests in (ROOT / ".ci" / "run").read_text()
    assert bash_blocks(PAGES["index.md"])[:2] == [demo, tests], (
        "docs/index.md gives the README's two commands"
    )


def test_every_example_config_is_valid():
    from dataminer_dagster.config import load_project_config

    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_project_config(path)


def test_every_project_file_in_the_docs_is_valid():
    import yaml

    from dataminer_dagster.config import parse_project_config

    blocks = {
        f"{name}: {block[:40]!r}": block
        for name, text in [("README.md", README), *PAGES.items()]
        for block in re.findall(r"```yaml\n(.*?)\n```", text, re.S)
        if block.startswith("name:")
    }
    assert len(blocks) >= 2
    for where, block in blocks.items():
        parse_project_config(yaml.safe_load(block), source=where)


def test_the_settings_block_lists_every_setting_with_its_default():
    import yaml

    from dataminer_dagster.lanes import DEFAULT_LANES
    from dataminer_dagster.settings import SettingsFile

    match = re.search(r"## Settings\n.*?```yaml\n(.*?)\n```", PAGES["configuration.md"], re.S)
    assert match, "docs/configuration.md lost its settings block"
    documented = yaml.safe_load(match.group(1))
    defaults = SettingsFile().model_dump()
    defaults["lanes"] = {
        lane.name: {
            "batch": lane.policy.batch,
            "max_runs": lane.policy.max_runs,
            **({"ahead": True} if lane.ahead else {}),
        }
        for lane in DEFAULT_LANES
    }
    assert documented == defaults
    SettingsFile.model_validate(documented)


def test_the_testing_example_is_the_test_that_runs():
    match = re.search(
        r"<!-- user-assets-test:start -->\n```python\n(.*)```\n<!-- user-assets-test:end -->",
        PAGES["extending.md"],
        re.S,
    )
    assert match, "docs/extending.md lost its user-assets-test markers"
    assert match.group(1) == (ROOT / "tests" / "test_user_assets.py").read_text()


def test_no_command_is_one_that_dg_supersedes():
    """Dagster 1.13 prints a SupersessionWarning for these; `dg` has their successors."""
    commands = "\n".join(
        command for text in [README, *PAGES.values()] for command in bash_blocks(text)
    )
    assert "dg launch" in commands
    for superseded in ("dagster dev", "dagster asset materialize", "dagster definitions validate"):
        assert superseded not in commands


def test_the_readme_links_resolve():
    """The README is read on the forge, outside the docs site: its links to files are checked
    here (the site's own links by `mkdocs build --strict`, below)."""
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [target for target in targets if "://" not in target]
    assert "docs/configuration.md" in local
    assert [target for target in local if not (ROOT / target).exists()] == []


def test_the_docs_site_builds_strict(tmp_path):
    """`mkdocs build --strict`: a broken link or anchor, a page missing from the nav or a nav entry
    without its page fails it."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "configuration" / "index.html").exists()
    assert (tmp_path / "bench" / "index.html").exists()
