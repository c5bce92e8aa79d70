"""The config and input parsers under generated input (Hypothesis, a fixed small budget that runs
in the normal suite): whatever the text, an answer within a second, never a traceback, and every
refusal one line per problem that names the key (or the place in the file)."""

from __future__ import annotations

import re
import string
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dataminer_dagster.assets.catalog.config import InputsConfig, SearchConfig
from dataminer_dagster.assets.catalog.inputs import PROBLEM_CHARS, collect_candidates
from dataminer_dagster.config import ConfigError, ProjectConfig, load_project_config
from dataminer_dagster.settings import Settings, SettingsError, load_settings

# Fixed and small (about a second a test here): the budget is examples, derandomized, so that
# every run asks the same.
BUDGET = settings(
    max_examples=50,
    deadline=1000,  # milliseconds: no example may take a second
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
KEYS = [
    "name",
    "inputs",
    "urls",
    "url_file",
    "filter",
    "positive_prompts",
    "download",
    "max_duration_s",
    "dataset",
    "splits",
    "search",
    "queries",
    "files",
    "detect",
    "x",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["https://youtu.be/dQw4w9WgXcQ", "http://169.254.169.254/", "-rf", "a\x00b"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)
    ),
    max_leaves=30,
)
MINIMAL = {
    "name": "p",
    "inputs": {"urls": ["https://youtu.be/dQw4w9WgXcQ"]},
    "filter": {"positive_prompts": ["a door"]},
}
# A problem line: two spaces, a dotted key (of words, indices or a quoted odd key), a colon.
PROBLEM_LINE = re.compile(
    r"  ([\w\-]+|'.*'|\".*\")(\.([\w\-]+|'.*'|\".*\"))*: .+|  \(and [\d,]+ more problems\)"
)


def _anchored(depth: int, width: int, placed: str) -> str:
    lines = ["a0: &a0 [" + ",".join(["x"] * width) + "]"]
    for n in range(1, depth + 1):
        lines.append(f"a{n}: &a{n} [" + ",".join([f"*a{n - 1}"] * width) + "]")
    return "x-anchors:\n" + "".join(f"  {line}\n" for line in lines) + placed.format(f"*a{depth}")


def _mutated(text: str, data) -> str:
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=4))
    for cut in cuts:
        text = (
            text[:cut]
            + data.draw(st.text(string.printable + "&*!|>{}[]:-#\x00\x85", max_size=6))
            + text[cut:]
        )
    return text


def _check_config_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "project.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        config = load_project_config(path)
    except ConfigError as error:
        message = str(error)
        first, *problems = message.splitlines()
        assert first.startswith(f"{path}: "), message
        assert len(first) < 600, first
        for line in problems:
            assert PROBLEM_LINE.fullmatch(line) and len(line) < 1200, line
        assert "Traceback" not in message
    else:
        assert isinstance(config, ProjectConfig)


@settings(BUDGET, max_examples=15)
@given(value=VALUES)
def test_any_yaml_value_under_a_key_is_taken_or_refused_by_key(tmp_path_factory, value):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    for config in ({**MINIMAL, "inputs": value}, {**MINIMAL, "filter": value}, value):
        _check_config_text(tmp_path, yaml.safe_dump(config, allow_unicode=True))


@BUDGET
@given(data=st.data())
def test_any_change_to_a_config_text_is_taken_or_refused_in_lines(tmp_path_factory, data):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    _check_config_text(tmp_path, _mutated(yaml.safe_dump(MINIMAL), data))


@BUDGET
@given(
    depth=st.integers(1, 12),
    width=st.integers(1, 12),
    placed=st.sampled_from(
        [
            "name: p\ninputs:\n  urls: {}\nfilter:\n  positive_prompts: [a]\n",
            "name: p\ninputs:\n  urls: [https://youtu.be/dQw4w9WgXcQ]\nfilter:\n  positive_prompts: {}\n",
            "name: {}\n",
            "dataset: {}\n",
        ]
    ),
)
def test_aliases_of_any_depth_and_width_are_answered_at_once(
    tmp_path_factory, depth, width, placed
):
    _check_config_text(tmp_path_factory.mktemp("fuzz"), _anchored(depth, width, placed))


@BUDGET
@given(content=st.binary(max_size=2000))
def test_any_bytes_of_a_url_file_or_query_file_are_used_line_by_line(tmp_path_factory, content):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    path = tmp_path / "list.txt"
    path.write_bytes(content)
    inputs = InputsConfig(
        url_file=path, search=SearchConfig(queries_file=path), max_list_file_lines=50
    )
    found = collect_candidates(inputs, lambda query, n: [])
    for problem in found.problems:
        assert "\n" not in problem and len(problem) <= PROBLEM_CHARS + 40, problem
        assert problem.startswith((f"url_file {path}", f"queries_file {path}")), problem


SETTINGS = {"retry": {"max_attempts": 3}, "leases": {"heartbeat_s": 10}, "lanes": {"video": {}}}
SETTINGS_KEYS = ["retry", "max_attempts", "leases", "heartbeat_s", "lanes", "video", "batch", "x"]
SETTINGS_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.sampled_from(SETTINGS_KEYS), inner, max_size=5),
    ),
    max_leaves=30,
)


def _check_settings_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        loaded = load_settings(path)
    except SettingsError as error:
        [line] = str(error).splitlines()
        assert line.startswith(f"{path}: ") and len(line) < 2000, line
    else:
        assert isinstance(loaded, Settings)


@settings(BUDGET, max_examples=15)
@given(value=SETTINGS_VALUES)
def test_any_yaml_value_in_a_settings_file_is_taken_or_refused_in_one_line(tmp_path_factory, value):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    for sections in ({**SETTINGS, "retry": value}, {**SETTINGS, "lanes": value}, value):
        _check_settings_text(tmp_path, yaml.safe_dump(sections, allow_unicode=True))


@BUDGET
@given(data=st.data())
def test_any_change_to_a_settings_text_is_taken_or_refused_in_one_line(tmp_path_factory, data):
    tmp_path = tmp_path_factory.mktemp("fuzz")
    _check_settings_text(tmp_path, _mutated(yaml.safe_dump(SETTINGS), data))
