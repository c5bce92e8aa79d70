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
        ({"inputs": {}}, "inputs: give at least one of search, urls, url_file, listings or files"),
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
        (
            {"dataset__splits": {"train": 0.7, "val": 0.2, "test": 0.2}},
            "dataset.splits: train, val and test must add up to 1, they add up to 1.1",
        ),
        (
            {"dataset__splits": {"train": 0, "val": 0.5, "test": 0.5}},
            "dataset.splits: train must be above 0",
        ),
        (
            {"dataset__formats": ["yolo", "voc"]},
            "dataset.formats.1: must be 'coco', 'yolo' or 'hf', got 'voc'",
        ),
        ({"dataset__formats": ["hf", "hf"]}, "list each format once; repeated: hf"),
        (
            {"dataset__formats": ["yolo"]},
            "dataset.formats has yolo, a format of boxes, and the project has no detect section",
        ),
        (
            {
                "dataset__formats": ["yolo"],
                "dataset__splits": {"train": 0.9, "val": 0, "test": 0.1},
                "detect": {"detector": "yolo", "model": "y.pt"},
            },
            "yolo, whose training needs a val split: give dataset.splits.val a share above 0",
        ),
        (
            {"dataset__dark_below": 200, "dataset__overexposed_above": 100},
            "dataset.dark_below must be below dataset.overexposed_above (200 >= 100)",
        ),
    ],
)
def test_errors_name_the_key_and_the_fix(changes, expected):
    with pytest.raises(ConfigError) as error:
        parse_project_config(_with(**changes), source="project.yaml")
    message = str(error.value)
    assert message.startswith("project.yaml: ")
    assert expected in message, message


def test_the_dataset_section_has_defaults_that_split_and_write_coco():
    config = parse_project_config(MINIMAL).dataset
    assert config.splits.model_dump() == {"train": 0.8, "val": 0.1, "test": 0.1}
    assert (config.seed, config.formats) == (0, ["coco"])
    written = parse_project_config(
        _with(dataset={"splits": {"train": 0.7, "val": 0.2, "test": 0.1}, "formats": ["hf"]})
    ).dataset
    assert written.splits.test == 0.1 and written.formats == ["hf"]  # 0.7 + 0.2 + 0.1 != 1.0


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


def test_model_and_backup_paths_resolve_against_the_config_folder(tmp_path: Path, monkeypatch):
    """Not against the working directory of whichever process runs the stage."""
    folder = tmp_path / "project"
    (folder / "models" / "siglip").mkdir(parents=True)
    (folder / "detector.pt").write_bytes(b"")
    (folder / "p.yaml").write_text(
        "name: p\ninputs: {urls: ['https://example.com/a.mp4']}\n"
        "filter: {positive_prompts: [a], model: models/siglip}\n"
        "dedup: {embeddings: dinov2, model: ../shared/dinov2}\n"
        "detect: {detector: yolo, model: detector.pt}\n"
        "backup: {dest: backups}\n"
    )
    monkeypatch.chdir(tmp_path)
    config = load_project_config(folder / "p.yaml")
    assert config.filter.model == str(folder / "models" / "siglip")
    assert config.dedup.model == str(tmp_path / "shared" / "dinov2")
    assert config.detect.model == str(folder / "detector.pt")
    assert config.backup.dest == str(folder / "backups")

    (folder / "p.yaml").write_text(
        "name: p\ninputs: {urls: ['https://example.com/a.mp4']}\n"
        "filter: {positive_prompts: [a], model: google/siglip2-base-patch16-224}\n"
        "detect: {detector: yolo, model: yolo11n.pt}\n"
        "backup: {dest: 'me@backup-host:/srv/frames'}\n"
    )
    config = load_project_config(folder / "p.yaml")  # hub ids, library names, remote: as given
    assert config.filter.model == "google/siglip2-base-patch16-224"
    assert config.detect.model == "yolo11n.pt"
    assert config.backup.dest == "me@backup-host:/srv/frames"


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


def test_safety_caps_have_defaults_that_a_config_can_raise_but_not_remove():
    defaults = parse_project_config(MINIMAL)
    assert (defaults.download.max_duration_s, defaults.download.max_filesize_mb) == (7200, 4096)
    assert defaults.download.min_free_disk_mb == defaults.extract.min_free_disk_mb == 1024
    assert (defaults.extract.max_frames, defaults.extract.max_frame_pixels) == (10_000, 7680 * 4320)
    assert (defaults.inputs.max_list_file_mb, defaults.inputs.max_list_file_lines) == (16, 100_000)
    assert defaults.inputs.max_file_matches == 10_000
    options = defaults.extract.options()
    assert (options.max_frames, options.max_frame_pixels) == (10_000, 7680 * 4320)

    raised = parse_project_config(
        _with(
            download={"max_duration_s": 86_400, "max_filesize_mb": 100_000},
            extract={"max_frames": 1_000_000, "max_frame_pixels": 16384 * 16384},
        )
    )
    assert raised.download.max_duration_s == 86_400
    assert raised.extract.options().max_frames == 1_000_000
    for key in ("download__max_filesize_mb", "extract__max_frames", "inputs__max_file_matches"):
        with pytest.raises(ConfigError, match=key.replace("__", ".")):
            parse_project_config(_with(**{key: None}))


def test_a_blocklist_file_adds_its_tags_and_its_comments_are_not_tags(tmp_path: Path):
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "blocked.txt").write_text(
        "# games\ngameplay\n#Minecraft\n\n// old entries\n#\n  prank  \ncover\n"
    )
    (tmp_path / "p.yaml").write_text(
        "name: p\n"
        "inputs: {urls: ['https://youtu.be/dQw4w9WgXcQ']}\n"
        "filter: {positive_prompts: [a door]}\n"
        "download: {blocked_hashtags: [cover, unboxing], blocked_hashtags_file: lists/blocked.txt}\n"
    )
    download = load_project_config(tmp_path / "p.yaml").download
    assert download.blocked_hashtags == ["cover", "unboxing", "gameplay", "#Minecraft", "prank"]
    assert download.blocked_hashtags_file == tmp_path / "lists" / "blocked.txt"

    (tmp_path / "lists" / "blocked.txt").unlink()
    with pytest.raises(ConfigError, match=r"download.blocked_hashtags_file: .*blocked.txt"):
        load_project_config(tmp_path / "p.yaml")


def test_politeness_settings_have_safe_defaults_and_name_their_errors():
    download = parse_project_config(MINIMAL).download
    assert download.max_downloads_per_host == 2 and download.proxies == []
    assert (download.pause_base_s, download.pause_max_s, download.max_pause_wait_s) == (
        60,
        3600,
        120,
    )
    assert download.sleep_interval_s is None, "unset: the host's default (YouTube: 10-20 s)"
    assert parse_project_config(MINIMAL).inputs.url_file is None
    assert (
        parse_project_config(
            _with(inputs={"search": {"queries": ["doors"]}})
        ).inputs.search.max_results_per_query
        == 50
    )
    with pytest.raises(ConfigError, match="download.rate_limit: String should match"):
        parse_project_config(_with(download={"rate_limit": "4 MB/s"}))
    with pytest.raises(ConfigError, match="pause_max_s must be at least download.pause_base_s"):
        parse_project_config(_with(download={"pause_base_s": 600, "pause_max_s": 60}))
    with pytest.raises(
        ConfigError, match=r"download.sleep_s: unknown key \(allowed here: .*sleep_interval_s"
    ):
        parse_project_config(_with(download={"sleep_s": 5}))


def _numeric_keys() -> list[tuple[str, type]]:
    """Every numeric key of the project config, dotted, with its type: found by walking the
    schema, so that a key added later is checked too."""
    from dataminer_dagster.config import ProjectConfig, _nested_model

    keys = []

    def walk(model, prefix: str) -> None:
        for name, field in model.model_fields.items():
            nested = _nested_model(field.annotation)
            if nested is not None:
                walk(nested, f"{prefix}{name}.")
                continue
            kinds = {field.annotation, *getattr(field.annotation, "__args__", ())}
            number = next((k for k in (float, int) if k in kinds), None)
            if number is not None:
                keys.append((f"{prefix}{name}", number))

    walk(ProjectConfig, "")
    return keys


def test_every_section_has_numeric_keys_to_bound():
    sections = {key.split(".")[0] for key, _ in _numeric_keys()}
    assert sections == {
        "inputs",
        "target",
        "download",
        "extract",
        "filter",
        "dedup",
        "detect",
        "dataset",
    }
    assert ("inputs.search.max_results_per_query", int) in _numeric_keys()


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (key, value)
        for key, kind in _numeric_keys()
        for value in ([10**30] if kind is int else [1e30, float("inf"), float("nan")])
    ],
)
def test_every_number_is_refused_unless_finite_and_bounded(key, value):
    """10**30 and .inf passed validation and then failed every extraction (islice) or the
    registration (JSON Infinity in PostgreSQL)."""
    config = _with(
        inputs__search={"queries": ["doors"]},
        detect={"detector": "yolo", "model": "y.pt"},
        **{"target__images": 10, key.replace(".", "__"): value},
    )

    with pytest.raises(ConfigError) as error:
        parse_project_config(config, source="project.yaml")

    [line] = str(error.value).splitlines()[1:]
    assert line.startswith(f"  {key}: "), line


def test_numbers_are_bounded_where_the_code_can_use_them(tmp_path: Path):
    (tmp_path / "p.yaml").write_text(
        "name: p\ninputs: {urls: ['https://youtu.be/dQw4w9WgXcQ']}\n"
        "filter: {positive_prompts: [a door]}\n"
        "extract: {max_frames: 1000000000000000000000000000000}\n"
        "download: {max_filesize_mb: .inf}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_project_config(tmp_path / "p.yaml")
    assert str(error.value).splitlines()[1:] == [
        "  download.max_filesize_mb: must be a finite number no larger than 2,147,483,647 "
        "(got inf)",
        "  extract.max_frames: must be a finite number no larger than 2,147,483,647 "
        "(got 1000000000000000000000000000000)",
    ]
    largest = parse_project_config(
        _with(extract={"max_frames": 2**31 - 1}, download={"max_filesize_mb": 2**31 - 1})
    )
    assert largest.extract.options().max_frames == 2**31 - 1
    with pytest.raises(ConfigError, match=r"inputs.max_list_file_mb: Input should be less than"):
        parse_project_config(_with(inputs={**MINIMAL["inputs"], "max_list_file_mb": 2048}))


@pytest.mark.parametrize(
    "key", ["filter__positive_prompts", "filter__negative_prompts", "filter__junk_prompts"]
)
def test_a_prompt_longer_than_any_text_model_reads_is_refused_in_one_line(key):
    """It was cut to the model's 64 tokens without a word and became a 10,010-character column
    name."""
    with pytest.raises(ConfigError) as error:
        parse_project_config(_with(**{key: ["a door", "x" * 10_000]}), source="project.yaml")
    [line] = str(error.value).splitlines()[1:]
    assert line.startswith(
        f"  {key.replace('__', '.')}: the prompt 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... "
        "is 10,000 characters long; a prompt may have at most 1,000 (text models read a few "
        "dozen words of it) (got ['a door', 'xxxx"
    ), line
    assert line.endswith("... (2 items))") and len(line) < 500, line
    assert parse_project_config(_with(**{key: ["x" * 1000]}))


def test_an_open_vocabulary_prompt_is_bounded_too():
    detect = {"detector": "owlv2", "model": "m", "prompts": ["y" * 1001]}
    with pytest.raises(ConfigError, match="detect.prompts: the prompt 'yyyy"):
        parse_project_config(_with(detect=detect))
