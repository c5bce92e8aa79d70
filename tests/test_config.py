"""Project config validation: errors name the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataminer_dagster.config import ConfigError, load_project_config, parse_project_config

MINIMAL = {
    "name": "p",
    "inputs": {"urls": ["https://youtu.be/dQw4w9WgXcQ"]},
    "filter": {"positive_prompts": ["a door"]},
}


def _with(**changes) -> dict:
    config = {k: (dict(v) if isinstance(v, dict) else v) for k, v in MINIMAL.items()}
    for dotted, value in changes.items():
        node = config
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return config


def test_minimal_config_has_no_domain_defaults():
    config = parse_project_config(MINIMAL)
    assert config.filter.negative_prompts == [] and config.filter.junk_prompts == []
    assert config.detect is None
    assert config.inputs.search is None


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"filter__threshold": 0.5},
            "filter.threshold: unknown key (allowed here: model, device, batch_size, positive_prompts",
        ),
        ({"colour": "red"}, "colour: unknown key (allowed here: name, output_dir, inputs"),
        (
            {"filter__positive_prompts": []},
            "filter.positive_prompts: List should have at least 1 item",
        ),
        (
            {"extract__strategy": "keyframe"},
            "extract.strategy: must be 'interval', 'time' or 'scene', got 'keyframe'",
        ),
        (
            {"extract__image_format": "jpeg"},
            "extract.image_format: must be 'jpg', 'png' or 'webp', got 'jpeg'",
        ),
        ({"name": "my project"}, "name: String should match pattern"),
        (
            {"filter__positive_threshold": 1.5},
            "filter.positive_threshold: Input should be less than or equal to 1",
        ),
        ({"inputs": {}}, "inputs: give at least one of search, urls, url_file or files"),
        (
            {"detect": {"detector": "owlv2", "model": "m"}},
            "detect: detect.prompts is required for the owlv2 detector",
        ),
        (
            {"detect": {"detector": "yolo", "model": "y.pt", "prompts": ["x"]}},
            "use detect.classes with yolo",
        ),
        (
            {"dedup__embeddings": "dinov2"},
            "dedup.model is required when dedup.embeddings is dinov2",
        ),
        (
            {"filter__positive_prompts": ["ok", "  "]},
            "filter.positive_prompts: prompts must not be blank",
        ),
    ],
)
def test_errors_name_the_key_and_the_fix(changes, expected):
    with pytest.raises(ConfigError) as error:
        parse_project_config(_with(**changes), source="project.yaml")
    message = str(error.value)
    assert message.startswith("project.yaml: ")
    assert expected in message, message


def test_missing_required_keys_are_listed():
    with pytest.raises(ConfigError) as error:
        parse_project_config({"name": "p"})
    assert "inputs: required" in str(error.value) and "filter: required" in str(error.value)


def test_file_errors_and_relative_paths(tmp_path: Path):
    with pytest.raises(ConfigError, match="file not found"):
        load_project_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_project_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_project_config(tmp_path / "list.yaml")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "p.yaml").write_text(
        "name: p\ninputs: {url_file: urls.txt, files: ['clips/*.mp4', '~/x.mp4']}\n"
        "filter: {positive_prompts: [a]}\noutput_dir: out\n"
    )
    config = load_project_config(tmp_path / "sub" / "p.yaml")
    assert config.inputs.url_file == tmp_path / "sub" / "urls.txt"
    assert config.inputs.files[0] == str(tmp_path / "sub" / "clips" / "*.mp4")
    assert config.inputs.files[1] == str(Path("~/x.mp4").expanduser())
    assert config.output_dir == tmp_path / "sub" / "out"


def test_config_hash_follows_the_content():
    a = parse_project_config(MINIMAL)
    b = parse_project_config(_with(filter__positive_threshold=0.2))
    assert a.config_hash() == parse_project_config(MINIMAL).config_hash() != b.config_hash()


def test_extraction_profiles_differ_only_when_the_output_would():
    time_1s = parse_project_config(
        _with(extract={"strategy": "time", "every_seconds": 1.0, "every_frames": 5})
    )
    time_1s_other_frames = parse_project_config(
        _with(extract={"strategy": "time", "every_seconds": 1.0, "every_frames": 9})
    )
    time_2s = parse_project_config(_with(extract={"strategy": "time", "every_seconds": 2.0}))
    profile = lambda c: c.extract.options().profile_id()  # noqa: E731
    assert profile(time_1s) == profile(time_1s_other_frames), (
        "every_frames does not matter for time"
    )
    assert profile(time_1s) != profile(time_2s)
