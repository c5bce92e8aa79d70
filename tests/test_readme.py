"""The README stays true to the code: its config reference is the schema's, its two commands are
the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

from dataminer_dagster.config import config_reference

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_config_reference_matches_the_schema():
    match = re.search(
        r"<!-- config-reference:start -->\n(.*)\n<!-- config-reference:end -->", README, re.S
    )
    assert match, "README.md lost its config-reference markers"
    assert match.group(1) == config_reference(), (
        "regenerate with: python -m dataminer_dagster.config"
    )


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    demo, tests = commands[0], commands[1]
    assert demo.endswith("dataminer demo")
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_every_example_config_is_valid():
    from dataminer_dagster.config import load_project_config

    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_project_config(path)


def test_the_settings_block_lists_every_setting_with_its_default():
    import yaml

    from dataminer_dagster.engine.lanes import DEFAULT_LANES
    from dataminer_dagster.settings import SettingsFile

    match = re.search(r"### Settings\n.*?```yaml\n(.*?)\n```", README, re.S)
    assert match, "README.md lost its settings block"
    documented = yaml.safe_load(match.group(1))
    defaults = SettingsFile().model_dump()
    defaults["lanes"] = {
        lane.name: {"batch": lane.policy.batch, "max_runs": lane.policy.max_runs}
        for lane in DEFAULT_LANES
    }
    assert documented == defaults
    SettingsFile.model_validate(documented)


def test_the_testing_example_is_the_test_that_runs():
    match = re.search(
        r"<!-- user-assets-test:start -->\n```python\n(.*)```\n<!-- user-assets-test:end -->",
        README,
        re.S,
    )
    assert match, "README.md lost its user-assets-test markers"
    assert match.group(1) == (ROOT / "tests" / "test_user_assets.py").read_text()


def test_no_command_is_one_that_dg_supersedes():
    """Dagster 1.13 prints a SupersessionWarning for these; `dg` has their successors."""
    commands = "\n".join(re.findall(r"```bash\n(.*?)\n```", README, re.S))
    for superseded in ("dagster dev", "dagster asset materialize", "dagster definitions validate"):
        assert superseded not in commands
