"""The settings file: defaults, the file, environment variables on top, errors a person can act on."""

from __future__ import annotations

import pytest
import yaml

from dataminer_dagster.lanes import LANES_BY_NAME, configured_lanes
from dataminer_dagster.settings import SettingsError, load_settings


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAMINER_HOME", str(tmp_path))
    for name in ("DATAMINER_SETTINGS", "DATAMINER_HEARTBEAT_SECONDS", "DATAMINER_MAX_ATTEMPTS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def write(path, sections: dict):
    path.write_text(yaml.safe_dump(sections))
    return path


def test_without_a_file_every_setting_has_its_default(home):
    settings = load_settings()
    assert settings.source is None
    assert (settings.lease.heartbeat_s, settings.lease.stale_after_s) == (15, 120)
    assert configured_lanes(settings) == tuple(LANES_BY_NAME.values())


def test_the_file_in_the_home_is_read_and_the_environment_wins(home, monkeypatch):
    write(
        home / "settings.yaml",
        {"leases": {"heartbeat_s": 2, "stale_after_s": 10}, "lanes": {"video": {"batch": 5}}},
    )
    monkeypatch.setenv("DATAMINER_HEARTBEAT_SECONDS", "1")
    settings = load_settings()
    assert settings.source == home / "settings.yaml"
    assert (settings.lease.heartbeat_s, settings.lease.stale_after_s) == (1, 10)
    video = next(lane for lane in configured_lanes(settings) if lane.name == "video")
    assert (video.policy.batch, video.policy.max_runs) == (5, 3), "the rest keeps its default"


def test_a_lane_can_be_told_not_to_run_ahead_and_only_the_ahead_lanes_can(home):
    write(home / "settings.yaml", {"lanes": {"filter": {"ahead": False}}})
    lanes = {lane.name: lane for lane in configured_lanes(load_settings())}
    assert not lanes["filter"].ahead and lanes["project"].ahead
    assert lanes["filter"].policy == LANES_BY_NAME["filter"].policy
    write(home / "settings.yaml", {"lanes": {"video": {"ahead": True}}})
    with pytest.raises(
        SettingsError, match="lanes.video.ahead: .* the lanes that can: filter, project"
    ):
        configured_lanes(load_settings())


def test_dataminer_settings_names_another_file(home, monkeypatch, tmp_path_factory):
    elsewhere = write(tmp_path_factory.mktemp("etc") / "dm.yaml", {"runs": {"ahead_wait_s": 0}})
    monkeypatch.setenv("DATAMINER_SETTINGS", str(elsewhere))
    assert load_settings().runs.ahead_wait_s == 0
    monkeypatch.setenv("DATAMINER_SETTINGS", str(home / "missing.yaml"))
    with pytest.raises(SettingsError, match="missing.yaml: no such file"):
        load_settings()


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        (
            {"leases": {"heartbeat": 1}},
            "leases.heartbeat: unknown key; allowed: heartbeat_s, outage_wait_s, stale",
        ),
        ({"lease": {}}, "lease: unknown key; allowed: lanes, leases, long_running, retry, runs"),
        (
            {"lanes": {"video": {"size": 3}}},
            "lanes.video.size: unknown key; allowed: ahead, batch, max",
        ),
        ({"runs": {"start_grace_s": -1}}, "runs.start_grace_s: Input should be greater than 0"),
        (
            {"leases": {"heartbeat_s": 150}},
            "leases: .*stale_after_s \\(120\\) must be at least twice heartbeat_s \\(150\\)",
        ),
        # A section that is not a mapping was a TypeError's traceback.
        ({"retry": 5}, "settings.yaml: retry: Input should be a valid dictionary"),
        ({"lanes": "video"}, "settings.yaml: lanes: Input should be a valid dictionary"),
    ],
)
def test_a_bad_file_is_refused_naming_the_key(home, sections, message):
    write(home / "settings.yaml", sections)
    with pytest.raises(SettingsError, match=message):
        load_settings()


def test_an_unknown_lane_names_the_lanes(home):
    write(home / "settings.yaml", {"lanes": {"gpu": {"batch": 3}}})
    with pytest.raises(SettingsError, match="unknown lane gpu; the lanes are catalog, video"):
        configured_lanes(load_settings())


def test_a_bad_environment_value_names_its_variable(home, monkeypatch):
    monkeypatch.setenv("DATAMINER_MAX_ATTEMPTS", "many")
    with pytest.raises(SettingsError, match=r"retry.max_attempts \(from DATAMINER_MAX_ATTEMPTS="):
        load_settings()


def test_the_cli_reports_a_bad_settings_file_without_a_traceback(home):
    from click.testing import CliRunner

    from dataminer_dagster.cli import main

    write(home / "settings.yaml", {"leases": {"stale_after_s": "soon"}})
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "settings.yaml: leases.stale_after_s: Input should be a valid number" in result.output
    assert "Traceback" not in result.output
