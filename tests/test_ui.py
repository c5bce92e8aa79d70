"""What a user sees in the Dagster UI, after a real demo run with its history kept (issue 15).

One demo run per module (`ui_demo`) serves two tests: the rules for what the UI receives (the
events' metadata, descriptions and check results, read back from the instance as the webserver
reads them), and a headless Chromium that opens the main pages of `dagster-webserver` and finds
the previews drawn as loaded <img> elements, without a click.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path

import cv2
import dagster as dg
import numpy as np
import pytest
import yaml

from dataminer_dagster.core.world import load_world
from dataminer_dagster.engine.previews import (
    DECIMALS,
    DESCRIPTION_HEIGHT,
    DESCRIPTION_WIDTH,
    INLINE_MARKDOWN_LIMIT,
    PREVIEW_BUDGET,
    VIDEO_PREVIEW_BUDGET,
)
from tests.helpers.browser import Browser, find_chromium
from tests.helpers.graphql import call
from tests.helpers.ui_demo import (
    demo_environment,
    dismiss_welcome,
    open_page,
    pages,
    previewed_video_partition,
    run_demo,
    webserver,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ui_demo")]

VIDEO_ASSETS = {"downloads", "frames", "frames_backup"}
PROJECT_VIDEO_ASSETS = {"filtered_frames"}
# The previews each asset shows (metadata thumbnail + description picture + file).
PREVIEWS = {
    "filtered_frames": {"kept_frames", "filter_scores"},
    "deduped_set": {"duplicate_groups"},
    "detections": {"detection_examples"},
    "dataset": {"dataset_sample", "quality_report"},
}
CHECKS = {
    ("frames", "frames_on_disk"): "videos",
    ("deduped_set", "no_duplicates_kept"): "projects",
    ("detections", "coco_valid"): "projects",
    ("dataset", "dataset_complete"): "projects",
    ("dataset", "splits_complete"): "projects",
    ("dataset", "no_pairs_across_splits"): "projects",
    ("dataset", "provenance_complete"): "projects",
    ("dataset", "splits_filled"): "projects",
    ("dataset", "image_quality"): "projects",
}
# Labels that made a reader guess (issue 15), and units that must be spelled out.
UNREADABLE_KEYS = {
    "seconds",
    "status",
    "size_bytes",
    "blocked_for",
    "profiles",
    "per_source",
    "frames_per_profile",
    "title",
}
DATA_IMAGE = re.compile(r"!\[[^\]]*\]\(data:image/(jpeg|png);base64,([A-Za-z0-9+/=]+)\)")


@pytest.fixture(scope="module")
def ui_demo(pg_server, tmp_path_factory) -> Iterator[dict[str, str]]:
    """A finished demo project whose Dagster history is kept: the environment that reaches it
    (DAGSTER_HOME, the database, the data directory)."""
    database = pg_server.new_database()
    env = demo_environment(tmp_path_factory.mktemp("ui"), pg_server.url(database))
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        run_demo()
        yield env
    pg_server.drop(database)


@pytest.fixture(scope="module")
def served(ui_demo) -> Iterator[str]:
    """`dagster-webserver` over the demo's instance: its base URL."""
    with webserver(ui_demo) as base:
        yield base


@pytest.fixture(scope="module")
def history(ui_demo) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.get() as instance:
        yield instance


def _events(instance: dg.DagsterInstance, event_type: dg.DagsterEventType) -> list:
    fetch = {
        dg.DagsterEventType.ASSET_MATERIALIZATION: instance.fetch_materializations,
        dg.DagsterEventType.ASSET_OBSERVATION: instance.fetch_observations,
    }.get(event_type)
    if fetch is None:
        records = instance.get_event_records(dg.EventRecordsFilter(event_type), limit=10_000)
    else:
        records = [
            record
            for key in instance.get_asset_keys()
            for record in fetch(key, limit=10_000).records
        ]
    return [r.event_log_entry.dagster_event for r in records]


def _images(markdown: str) -> list[np.ndarray]:
    """Every data-URI image of `markdown`, decoded (fails the test if one does not decode)."""
    pictures = []
    for kind, data in DATA_IMAGE.findall(markdown):
        raw = base64.b64decode(data)
        assert raw[:3] == b"\xff\xd8\xff" if kind == "jpeg" else raw[:4] == b"\x89PNG"
        picture = cv2.imdecode(np.frombuffer(raw, np.uint8), cv2.IMREAD_COLOR)
        assert picture is not None, "a preview that no browser can draw"
        pictures.append(picture)
    return pictures


def _problems_of(asset: str, partition: str, metadata, description: str | None) -> list[str]:
    """Every broken rule of one event, as text (the test lists them all at once)."""
    where = f"{asset}[{partition}]"
    problems = []
    for key, value in metadata.items():
        if key in UNREADABLE_KEYS or key.endswith("_s"):
            problems.append(f"{where}: label {key!r} needs guessing")
        if key == "attempt" and value.value <= 1:
            problems.append(f"{where}: attempt {value.value} shown")
        if isinstance(value, dg.FloatMetadataValue) and round(value.value, DECIMALS) != value.value:
            problems.append(f"{where}: {key} {value.value} is not rounded to {DECIMALS} places")
        if isinstance(value, dg.JsonMetadataValue):
            problems.append(f"{where}: {key} is JSON, not a flat value")
        if isinstance(value, dg.TextMetadataValue) and re.fullmatch(r"/\S+", value.text):
            problems.append(f"{where}: {key} is a path shown as text: {value.text}")
        if isinstance(value, dg.MarkdownMetadataValue):
            if key.endswith("_picture"):
                pictures = _images(value.md_str)
                if max(p.shape[0] for p in pictures) > DESCRIPTION_HEIGHT:
                    problems.append(f"{where}: {key} is taller than [Show Markdown] shows")
                if max(p.shape[1] for p in pictures) > DESCRIPTION_WIDTH:
                    problems.append(f"{where}: {key} is wider than [Show Markdown] shows")
                budget = VIDEO_PREVIEW_BUDGET if asset in PROJECT_VIDEO_ASSETS else PREVIEW_BUDGET
                if len(value.md_str) > 4 / 3 * budget + 200:
                    problems.append(f"{where}: {key} is over its size budget")
            elif len(value.md_str) >= INLINE_MARKDOWN_LIMIT:
                problems.append(f"{where}: {key} hides behind [Show Markdown]")
            if len(_images(value.md_str)) != 1:
                problems.append(f"{where}: {key} is not one picture")
        if key.endswith("_file"):
            if not isinstance(value, dg.PathMetadataValue):
                problems.append(f"{where}: {key} is not a path")
            elif Path(value.path).read_bytes()[:4] != b"\x89PNG":
                problems.append(f"{where}: {key} is not a PNG file")
    if description and ("base64" in description or DATA_IMAGE.search(description)):
        problems.append(f"{where}: the description (the run log's message) holds image data")
    return problems


def test_what_the_ui_receives_follows_the_rules(ui_demo, history):
    materializations = _events(history, dg.DagsterEventType.ASSET_MATERIALIZATION)
    observations = _events(history, dg.DagsterEventType.ASSET_OBSERVATION)
    assert len({e.asset_key.to_user_string() for e in materializations}) == 7, (
        "every asset but the backup was materialized"
    )
    problems = []
    previews: dict[str, set[str]] = {}
    for event in materializations + observations:
        item = (
            event.step_materialization_data.materialization
            if event.is_step_materialization
            else event.asset_observation_data.asset_observation
        )
        asset, metadata = item.asset_key.to_user_string(), item.metadata
        problems += _problems_of(asset, item.partition, metadata, item.description)
        if asset in VIDEO_ASSETS | PROJECT_VIDEO_ASSETS and "video_title" not in metadata:
            problems.append(f"{asset}[{item.partition}]: no video title")
        found = {
            k
            for k, v in metadata.items()
            if isinstance(v, dg.MarkdownMetadataValue) and not k.endswith("_picture")
        }
        if event.is_step_materialization:
            previews.setdefault(asset, set()).update(found)
            if any(f"{k}_picture" not in metadata for k in found):
                problems.append(f"{asset}[{item.partition}]: previews without their pictures")
    assert not problems, "\n".join(problems)
    assert {a: previews.get(a, set()) for a in PREVIEWS} == PREVIEWS

    videos = set(history.get_dynamic_partitions("videos"))
    backup = [
        e.asset_observation_data.asset_observation
        for e in observations
        if e.asset_key == dg.AssetKey("frames_backup")
    ]
    nothing_to_do = {
        o.partition
        for o in backup
        if o.metadata["outcome"].text.startswith("nothing to do: no backup configured")
    }
    served = load_world(Path(ui_demo["DATAMINER_HOME"]) / "demo" / "www").truths
    assert len(videos) == len(served)
    # a copy of another video (one file of the demo is served at two URLs) has no frames of its
    # own: its frames item is done as the original's, and no backup is its to say nothing of
    copies = {
        e.step_materialization_data.materialization.partition
        for e in materializations
        if e.asset_key == dg.AssetKey("frames")
        and "same_as" in e.step_materialization_data.materialization.metadata
    }
    assert len(copies) == 1 and nothing_to_do == videos - copies


def test_checks_are_per_partition_with_numbers_that_plot(history):
    evaluations = [
        e.event_specific_data for e in _events(history, dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    ]
    seen: dict[tuple[str, str], set[str]] = {}
    for evaluation in evaluations:
        check = (evaluation.asset_key.to_user_string(), evaluation.check_name)
        assert evaluation.passed, f"{check} failed on the demo: {evaluation.description}"
        assert evaluation.partition is not None, f"{check} has no partition"
        assert evaluation.target_materialization_data is not None, f"{check} names no event"
        assert evaluation.metadata, f"{check} has nothing to plot"
        assert all(
            isinstance(v, dg.IntMetadataValue | dg.FloatMetadataValue)
            for v in evaluation.metadata.values()
        ), f"{check}: {evaluation.metadata}"
        seen.setdefault(check, set()).add(evaluation.partition)
    expected = {
        check: set(history.get_dynamic_partitions(partitions))
        for check, partitions in CHECKS.items()
    }
    assert seen == expected

    (complete,) = [e for e in evaluations if e.check_name == "dataset_complete"]
    counts = {k: v.value for k, v in complete.metadata.items()}
    assert counts["images"] == counts["manifest_rows"] == counts["coco_images"] > 0
    assert counts["missing_files"] == 0


def test_kinds_are_true(history):
    from dataminer_dagster.definitions import defs

    kinds = {spec.key.to_user_string(): set(spec.kinds) for spec in defs.resolve_all_asset_specs()}
    assert "youtube" not in kinds["video_catalog"], "it also reads local files and plain URLs"
    assert kinds["dataset"] >= {"parquet", "json", "image"}
    assert all(0 < len(k) <= 3 for k in kinds.values()), kinds


@pytest.mark.skipif(find_chromium() is None, reason="Chromium is not installed (Debian: chromium)")
def test_previews_are_images_that_load_in_a_browser(served, history, tmp_path):
    partition = previewed_video_partition(history)
    failures = []
    base = served
    with Browser(find_chromium()) as browser:
        dismiss_welcome(browser, base)
        for page in pages(partition):
            found = open_page(browser, base, page)
            browser.screenshot(tmp_path / f"{page.name}.png")
            loaded = [i for i in found if i["complete"] and i["width"] > 0 and i["shown"]]
            if len(loaded) < page.previews or len(loaded) != len(found):
                failures.append(f"{page.path}: {page.previews} previews wanted, found {found}")
            hidden = browser.evaluate("document.body.innerText").count("[Show Markdown]")
            if hidden > page.pictures:
                failures.append(
                    f"{page.path}: {hidden} values behind [Show Markdown], "
                    f"only its {page.pictures} pictures may be"
                )
    assert not failures, "\n".join(failures) + f"\n(screenshots in {tmp_path})"


# -- a followed project's schedule (sensors/refresh_schedules.py) ---------------------------------

LOCATION = {
    "repositoryName": "__repository__",
    "repositoryLocationName": "dataminer_dagster.definitions",
}
SCHEDULES = """
query Schedules($selector: RepositorySelector!) {
  schedulesOrError(repositorySelector: $selector) {
    __typename
    ... on Schedules {
      results { name cronSchedule executionTimezone scheduleState { id status } }
    }
  }
}"""
STOP_SCHEDULE = """
mutation Stop($id: String!) {
  stopRunningSchedule(id: $id) {
    __typename
    ... on ScheduleStateResult { scheduleState { status } }
    ... on PythonError { message }
  }
}"""
RELOAD = """
mutation Reload($location: String!) {
  reloadRepositoryLocation(repositoryLocationName: $location) {
    __typename
    ... on WorkspaceLocationEntry { loadStatus }
    ... on PythonError { message }
  }
}"""


def _schedules(base: str) -> dict[str, dict]:
    answer = call(base, SCHEDULES, {"selector": LOCATION})["schedulesOrError"]
    assert answer["__typename"] == "Schedules", answer
    return {s["name"]: s for s in answer["results"]}


def _reload(base: str) -> None:
    """The UI's "Reload definitions", until the code location has loaded again."""
    answer = call(base, RELOAD, {"location": LOCATION["repositoryLocationName"]})
    assert answer["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry", answer
    deadline = time.monotonic() + 120
    while call(base, WORKSPACE, {})["workspaceOrError"]["locationEntries"][0]["loadStatus"] != (
        "LOADED"
    ):
        assert time.monotonic() < deadline, "the code location did not load again in 120 s"
        time.sleep(0.5)


WORKSPACE = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"


def test_a_followed_projects_schedule_shows_and_switches_off_in_the_ui(served, tmp_path):
    from click.testing import CliRunner

    from dataminer_dagster.cli import main

    base = served
    assert not [name for name in _schedules(base) if name.startswith("refresh_")]
    config = tmp_path / "follows.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "b-roll",
                "output_dir": str(tmp_path / "out"),
                "inputs": {
                    "listings": ["http://127.0.0.1:9/feed.xml"],
                    "refresh": {"cron": "0 */6 * * *", "timezone": "Europe/Berlin"},
                },
                "filter": {"positive_prompts": ["a forklift"]},
            }
        )
    )
    added = CliRunner().invoke(main, ["project", "add", str(config)])
    assert added.exit_code == 0, added.output
    assert "refresh_project_b_roll schedule" in added.output, added.output

    # The running UI shows the schedule once it loads the definitions again, running.
    _reload(base)
    schedule = _schedules(base)["refresh_project_b_roll"]
    assert (schedule["cronSchedule"], schedule["executionTimezone"]) == (
        "0 */6 * * *",
        "Europe/Berlin",
    )
    assert schedule["scheduleState"]["status"] == "RUNNING"

    # Turned off as the UI's switch does; the instance keeps it off across loads.
    stopped = call(base, STOP_SCHEDULE, {"id": schedule["scheduleState"]["id"]})
    assert stopped["stopRunningSchedule"]["scheduleState"]["status"] == "STOPPED", stopped
    _reload(base)
    assert _schedules(base)["refresh_project_b_roll"]["scheduleState"]["status"] == "STOPPED"

    if (chromium := find_chromium()) is not None:  # its page in a browser: its cron, off
        with Browser(chromium) as browser:
            dismiss_welcome(browser, base)
            location = LOCATION["repositoryLocationName"]
            browser.open(f"{base}/locations/{location}/schedules/refresh_project_b_roll")
            browser.wait_for(
                "document.body && document.body.innerText.includes('0 */6 * * *')"
                " && document.querySelector('input[type=checkbox]') !== null",
                60,
                what="the schedule's page with its switch",
            )
            switches = browser.evaluate(
                "[...document.querySelectorAll('input[type=checkbox]')].map(i => i.checked)"
            )
            browser.screenshot(tmp_path / "schedule.png")
            assert switches == [False], f"{switches} (screenshot in {tmp_path})"
