"""Configs, URL files and query files someone else wrote: parsed within bounds, refused in one
line that names the key, and a bad line of a file refused alone."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dataminer_dagster.assets.catalog.config import InputsConfig, SearchConfig
from dataminer_dagster.assets.catalog.inputs import collect_candidates
from dataminer_dagster.config import ConfigError, load_project_config, parse_project_config
from dataminer_dagster.settings import SettingsError, load_settings

MINIMAL = """\
name: p
inputs:
  urls: [https://youtu.be/dQw4w9WgXcQ]
filter:
  positive_prompts: [a door]
"""


def _laughs(levels: int = 9) -> str:
    """A 'billion laughs': nine anchors, each nine aliases of the one before (10^9 values)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for n in range(1, levels + 1):
        lines.append(f"l{n}: &l{n} [" + ",".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "placed",
    [
        "filter:\n  positive_prompts: *l9\n",
        "inputs:\n  urls: *l9\n",
        "dataset:\n  splits: *l9\n",
    ],
)
def test_a_billion_laughs_config_is_refused_at_once_in_one_line(tmp_path: Path, placed):
    path = tmp_path / "project.yaml"
    path.write_text(
        "x-anchors:\n" + _laughs().replace("\nl", "\n  l").replace("l0:", "  l0:", 1) + placed
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        load_project_config(path)
    assert time.monotonic() - started < 1.0
    [line] = str(error.value).splitlines()
    assert line.startswith(f"{path}: ") and "each YAML alias counted" in line and len(line) < 300, (
        line
    )


def test_a_config_larger_than_the_bound_is_refused_before_it_is_parsed(tmp_path: Path, monkeypatch):
    path = tmp_path / "project.yaml"
    path.write_text(MINIMAL + "# " + "x" * (5 * 2**20) + "\n")
    with pytest.raises(ConfigError, match=r"larger than 4 MB.*DATAMINER_MAX_CONFIG_MB"):
        load_project_config(path)
    monkeypatch.setenv("DATAMINER_MAX_CONFIG_MB", "8")
    assert load_project_config(path).name == "p"


def test_a_billion_laughs_settings_file_is_refused_in_one_line_naming_it(
    tmp_path: Path, monkeypatch
):
    """The settings file was read with yaml.safe_load, outside the bounds a project config is read
    in: its aliases were expanded by whatever walked them, and its size had no bound."""
    from click.testing import CliRunner

    from dataminer_dagster.cli import main

    monkeypatch.setenv("DATAMINER_HOME", str(tmp_path))
    monkeypatch.delenv("DATAMINER_SETTINGS", raising=False)
    path = tmp_path / "settings.yaml"
    path.write_text(_laughs() + "lanes:\n  video:\n    batch: *l9\n")
    with pytest.raises(SettingsError) as error:
        load_settings()
    [line] = str(error.value).splitlines()
    assert line.startswith(f"{path}: ") and "each YAML alias counted" in line and len(line) < 300, (
        line
    )
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"Error: {line}" in result.output.splitlines()

    path.write_text("retry:\n  max_attempts: 3\n# " + "x" * (2 * 2**20) + "\n")
    with pytest.raises(SettingsError, match=rf"^{re.escape(str(path))}: larger than 1 MB$"):
        load_settings()


def test_a_value_in_an_error_is_shown_by_a_bounded_prefix_of_it():
    """The error about a 100,000-item list of 1,000-character texts quotes a few of them."""
    huge = ["y" * 1000] * 100_000
    started = time.monotonic()
    with pytest.raises(ConfigError) as error:
        parse_project_config(
            {"name": "p", "inputs": {"urls": huge}, "filter": {"positive_prompts": ["a"]}}
        )
    assert time.monotonic() - started < 1.0
    [header, line] = str(error.value).splitlines()
    assert line.startswith("  inputs.urls: has 100,000 items; a list may have at most 10,000")
    assert line.endswith("... (100,000 items))") and len(line) < 600, line


@pytest.mark.parametrize(
    ("value", "expected"),
    [("a\x00door", "control character '\\x00' at position 1"), ("d" * 20_000, "at most 16,384")],
)
def test_texts_of_a_config_are_bounded_and_hold_no_control_characters(value, expected):
    with pytest.raises(ConfigError, match=r"filter\.positive_prompts: .*" + re.escape(expected)):
        parse_project_config(
            {
                "name": "p",
                "inputs": {"urls": ["https://youtu.be/dQw4w9WgXcQ"]},
                "filter": {"positive_prompts": [value]},
            }
        )


def test_yaml_errors_are_one_line_with_their_place(tmp_path: Path):
    path = tmp_path / "project.yaml"
    path.write_text("name: p\ninputs: [\n")
    with pytest.raises(ConfigError) as error:
        load_project_config(path)
    [line] = str(error.value).splitlines()
    assert line.startswith(f"{path}: not valid YAML at line 3"), line


def test_a_queries_file_of_laughs_is_refused_at_once(tmp_path: Path):
    path = tmp_path / "queries.yaml"
    path.write_text(_laughs() + "queries: *l9\n")
    started = time.monotonic()
    found = collect_candidates(
        InputsConfig(search=SearchConfig(queries=["doors"], queries_file=path)),
        lambda query, n: [],
    )
    assert time.monotonic() - started < 1.0
    [problem] = found.problems
    assert problem.startswith(f"queries_file {path}: ") and "each YAML alias counted" in problem, (
        problem
    )
    assert found.per_source == {"search: doors": 0}, "the config's queries are still asked"


def test_a_bad_line_of_a_url_file_is_refused_by_its_number_and_the_rest_used(tmp_path: Path):
    """One NUL byte failed the catalog's insert and with it the whole project; one byte that is
    not UTF-8 had the whole file refused."""
    path = tmp_path / "urls.txt"
    path.write_bytes(
        b"https://example.com/a.mp4\n"
        b"http://127.0.0.1:47400/x\x00y.mp4\n"
        b"https://example.com/\xff.mp4\n"
        b"https://example.com/" + b"z" * 70_000 + b".mp4\n"
        b"https://example.com/b\x1b[31m.mp4\n"
        b"https://example.com/c.mp4\n"
    )
    found = collect_candidates(InputsConfig(url_file=path), lambda query, n: [])
    assert [c.url for c in found.candidates] == [
        "https://example.com/a.mp4",
        "https://example.com/c.mp4",
    ]
    assert [p.removeprefix(f"url_file {path} ") for p in found.problems] == [
        "line 2: holds the control character '\\x00' at position 25; the line was not used",
        "line 3: not UTF-8 text (byte 21 is b'\\xff'); the line was not used",
        "line 4: 70,024 bytes long, over 8,192; the line was not used",
        "line 5: holds the control character '\\x1b' at position 22; the line was not used",
    ]


def test_a_bad_line_of_a_query_file_is_refused_by_its_number(tmp_path: Path):
    path = tmp_path / "queries.txt"
    path.write_bytes(b"doors\nwin\x00dows\n\xfe\nstairs\n")
    asked = []
    found = collect_candidates(
        InputsConfig(search=SearchConfig(queries_file=path)),
        lambda query, n: asked.append(query) or [],
    )
    assert asked == ["doors", "stairs"]
    assert [p.removeprefix(f"queries_file {path} ") for p in found.problems] == [
        "line 2: holds the control character '\\x00' at position 4; the line was not used",
        "line 3: not UTF-8 text (byte 1 is b'\\xfe'); the line was not used",
    ]


def test_a_metadata_address_is_refused_when_the_inputs_are_read(tmp_path: Path):
    found = collect_candidates(
        InputsConfig(
            urls=[
                "http://169.254.169.254/latest/meta-data/",
                "http://[fe80::1]/x.mp4",
                "https://example.com/a.mp4",
            ]
        ),
        lambda query, n: [],
    )
    assert [c.url for c in found.candidates] == ["https://example.com/a.mp4"]
    assert found.problems == [
        "url 'http://169.254.169.254/latest/meta-data/': refused: 169.254.169.254 is a "
        "link-local or cloud metadata address, never fetched from",
        "url 'http://[fe80::1]/x.mp4': refused: fe80::1 is a link-local or cloud metadata "
        "address, never fetched from",
    ]


@pytest.mark.parametrize("name", ["-rf", "--help", "-"])
def test_a_project_name_that_reads_as_an_option_is_refused(name):
    with pytest.raises(ConfigError) as error:
        parse_project_config(
            {
                "name": name,
                "inputs": {"urls": ["https://youtu.be/dQw4w9WgXcQ"]},
                "filter": {"positive_prompts": ["a door"]},
            }
        )
    [line] = str(error.value).splitlines()[1:]
    assert line.startswith(f"  name: a project name may not start with '-' ({name!r}"), line
