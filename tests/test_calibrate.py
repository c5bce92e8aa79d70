"""`dataminer calibrate` on a project over the synthetic world, filtered by the SigLIP model
trained on it: a sample exported for review, answered from the world's truth as Label Studio
exports answers, the threshold recommended for a precision checked against the one that truly
reaches it over all the project's frames, frames added where they narrow the estimate, and
`--apply` filtering again from the cache."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from dataminer_dagster.cli import main
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.world import load_world, plan_world, write_world
from dataminer_dagster.core.world_render import SHAPES
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.models.world_models import WORLD_SIGLIP
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources
from tests.helpers.project_runs import dataminer
from tests.helpers.review import use_changing_data

pytestmark = pytest.mark.slow

WORLD_SEED = 44  # no other test or script uses it
COLOUR = "red"  # the shipped model tells the world's colours apart far better than its shapes
PROMPTS = [f"a {COLOUR} {shape}" for shape in SHAPES]
PRECISION = 0.9


def _refused(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.fixture
def world_project(tmp_path, database_url, engine):
    world_dir = tmp_path / "world"
    write_world(world_dir, plan_world(WORLD_SEED))
    world = load_world(world_dir)
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    files = sorted({str(world_dir / path) for path in world.truths if "alias" not in path})
    config = parse_project_config(
        {
            "name": "calib",
            "output_dir": str(tmp_path / "out" / "calib"),
            "inputs": {"files": files},
            "extract": {"strategy": "time", "every_seconds": 0.2},
            "filter": {
                "model": str(WORLD_SIGLIP),
                "device": "cpu",
                "positive_prompts": PROMPTS,
                "positive_threshold": 0.5,
            },
            "dedup": {"threshold": 0.999},
        }
    )
    catalog.projects.register(config)
    defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
    with instance_for_test() as instance:
        result = drive_quietly(["calib"], instance=instance, defs=defs, store=catalog.store)
        assert result.stages == {"calib": "complete"}, result
        yield catalog, world


def _frames(catalog, world) -> pd.DataFrame:
    """Every scored frame of the project with its truth: does it show an object of the colour?"""
    project = catalog.projects.get("calib")
    paths = ProjectPaths(project.output_dir)
    videos = catalog.videos.get([p.stem for p in paths.filter_dir.glob("*.parquet")])
    parts = []
    for video_id, video in videos.items():
        table = pd.read_parquet(paths.filter_table(video_id))
        truth = world.truth_for(video.source_path)
        table["yes"] = [
            any(o.colour == COLOUR for o in truth.at(t).objects) for t in table["timestamp"]
        ]
        table["frame"] = [f"{video_id}_{i:06d}.jpg" for i in table["frame_index"]]
        parts.append(table)
    return pd.concat(parts, ignore_index=True)


def _truly_reaching(frames: pd.DataFrame, precision: float) -> float:
    """The lowest threshold at which the project's frames kept are `precision` yes."""
    scores = frames["pos_max"].to_numpy(np.float32)
    for t in np.unique(scores):
        kept = frames[scores > t]
        if len(kept) and kept["yes"].mean() >= precision:
            return float(t)
    raise AssertionError(f"no threshold reaches precision {precision} on this world")


def _answered(tasks: list[dict], truth: dict[str, bool]) -> list[dict]:
    """Label Studio's JSON export of the tasks, each answered yes or no as the truth says."""
    return [
        {
            "id": n,
            "data": task["data"],
            "annotations": [
                {
                    "id": n,
                    "was_cancelled": False,
                    "created_at": "2026-12-05T10:00:00Z",
                    "result": [
                        {
                            "type": "choices",
                            "from_name": "match",
                            "to_name": "image",
                            "value": {"choices": ["yes" if truth[task["data"]["frame"]] else "no"]},
                        }
                    ],
                }
            ],
        }
        for n, task in enumerate(tasks, start=1)
    ]


def test_calibration_recommends_the_threshold_that_reaches_the_precision_and_applies_it(
    world_project, database_url, tmp_path, monkeypatch
):
    catalog, world = world_project
    use_changing_data(database_url, tmp_path, monkeypatch)
    assert "no project named 'nope'" in _refused("calibrate", "export", "nope", str(tmp_path / "x"))
    assert "no calibration sample" in _refused("calibrate", "show", "calib")
    unfiltered = catalog.projects.get("calib").config.to_json()
    unfiltered.update(name="unfiltered", output_dir=str(tmp_path / "out" / "unfiltered"))
    catalog.projects.register(parse_project_config(unfiltered))
    assert "project unfiltered has no filtered frames yet" in _refused(
        "calibrate", "export", "unfiltered", str(tmp_path / "x")
    )

    said = dataminer(
        "calibrate", "export", "calib", str(tmp_path / "sample"), "--image-url", "http://h/i"
    )
    frames = _frames(catalog, world)
    assert f"48 of the {len(frames)} frames of project calib" in said
    tasks = json.loads((tmp_path / "sample" / "tasks.json").read_text())
    assert len(tasks) == 48 and len({t["data"]["frame"] for t in tasks}) == 48
    for task in tasks:
        assert task["data"]["image"] == "http://h/i/" + task["data"]["frame"]
        assert (tmp_path / "sample" / "images" / task["data"]["frame"]).is_file()
    assert 'name="match"' in (tmp_path / "sample" / "labeling.xml").read_text()

    assert "no answers" in _refused("calibrate", "show", "calib")
    (tmp_path / "empty.json").write_text("[]")
    assert "nothing was imported" in _refused(
        "calibrate", "import", "calib", str(tmp_path / "empty.json")
    )

    truth = dict(zip(frames["frame"], frames["yes"], strict=True))
    (tmp_path / "half.json").write_text(json.dumps(_answered(tasks[:24], truth)))
    said = dataminer("calibrate", "import", "calib", str(tmp_path / "half.json"))
    assert "24 of the sample's 48 frames are answered" in said and "(best F1;" in said
    (tmp_path / "answers.json").write_text(json.dumps(_answered(tasks, truth)))
    said = dataminer(
        "calibrate",
        "import",
        "calib",
        str(tmp_path / "answers.json"),
        "--precision",
        str(PRECISION),
    )
    yes = sum(truth[t["data"]["frame"]] for t in tasks)
    assert f"imported 48 answers (label-studio): {yes} yes, {48 - yes} no; 48 of" in said
    assert f"estimates for all {len(frames)} frames of the project" in said
    recommended = float(re.search(r"recommended positive_threshold: ([0-9.e-]+)", said)[1])
    # Its row: the frames kept counted, the estimate reaching the precision, the project's true
    # precision and recall in the intervals.
    row = re.search(
        r"\n +([0-9.]+) +(\d+) +(\S+) \[(\S+)-(\S+)\] +\S+ \[(\S+)-(\S+)\] +<- recommended", said
    )
    kept = frames[frames["pos_max"] > np.float32(recommended)]
    assert float(row[1]) == recommended and int(row[2]) == len(kept)
    assert float(row[3]) >= PRECISION
    # One draw of 48 answers can place the threshold far from where the precision is truly reached:
    # this one (seed 0) answered one of the two frames not red among 13 of a stratum, and lands
    # 0.4 above it, one draw in 20 on this world (bench/calibration.py). Here: at least about
    # the precision asked, inside the interval printed.
    truly = _truly_reaching(frames, PRECISION)
    assert kept["yes"].mean() >= PRECISION - 0.1, said
    assert float(row[4]) <= kept["yes"].mean() <= float(row[5]), said
    assert float(row[6]) <= kept["yes"].sum() / frames["yes"].sum() <= float(row[7]), said

    # Frames added where they narrow the estimate at that threshold, the 48 answers kept.
    assert "--precision aims the frames that --more adds" in _refused(
        "calibrate", "export", "calib", str(tmp_path / "x"), "--precision", "0.9"
    )
    said = dataminer(
        "calibrate",
        "export",
        "calib",
        str(tmp_path / "more"),
        "--more",
        "--precision",
        str(PRECISION),
        "--image-url",
        "http://h/i",
    )
    assert f"48 more of the {len(frames)} frames of project calib" in said, said
    assert f"narrow the estimate at {recommended:g}" in said and "has 96 frames now" in said, said
    added = json.loads((tmp_path / "more" / "tasks.json").read_text())
    assert len(added) == 48
    assert not {t["data"]["frame"] for t in added} & {t["data"]["frame"] for t in tasks}
    assert all((tmp_path / "more" / "images" / t["data"]["frame"]).is_file() for t in added)
    (tmp_path / "more.json").write_text(json.dumps(_answered(added, truth)))
    said = dataminer(
        "calibrate", "import", "calib", str(tmp_path / "more.json"), "--precision", str(PRECISION)
    )
    assert "96 of the sample's 96 frames are answered" in said and "from 96 answers" in said
    recommended = float(re.search(r"recommended positive_threshold: ([0-9.e-]+)", said)[1])
    kept = frames[frames["pos_max"] > np.float32(recommended)]
    # With them, within 0.05 of the threshold that truly reaches the precision (on this world in
    # each of 20 draws, bench/calibration.py), and about that precision.
    assert abs(recommended - truly) <= 0.05 and kept["yes"].mean() >= PRECISION - 0.02, said

    said = dataminer("calibrate", "show", "calib", "--precision", str(PRECISION), "--apply")
    assert "changed: filter.positive_threshold" in said
    project = catalog.projects.get("calib")
    assert project.config.filter.positive_threshold == recommended
    after = _frames(catalog, world)
    assert after["passed"].tolist() == (after["pos_max"] > np.float32(recommended)).tolist()
    assert after["passed"].sum() != frames["passed"].sum()

    # A sample drawn by an earlier version of dataminer (other fields) is refused, not misread.
    sample_file = ProjectPaths(project.output_dir).calibration_dir / "sample.json"
    drawn = sample_file.read_text()
    sample_file.write_text(drawn.replace('"dataminer-calibration/2"', '"dataminer-calibration/1"'))
    refused = _refused("calibrate", "show", "calib")
    assert "calibration sample" in refused and "draw a new one" in refused
    assert "dataminer calibrate export calib DEST" in refused
    # Frames scored otherwise than when the sample was drawn: no frames are added to it.
    sample = json.loads(drawn)
    sample["frames"][0][1] = sample["frames"][0][1] / 2
    sample_file.write_text(json.dumps(sample))
    refused = _refused("calibrate", "export", "calib", str(tmp_path / "x"), "--more")
    assert "frames or their scores are not those its calibration sample was drawn from" in refused
    sample_file.write_text(drawn)

    # New prompts not filtered yet: neither a new sample nor the old one's answers fit them.
    changed = project.config.to_json()
    changed["filter"]["positive_prompts"] = ["a red circle"]
    catalog.projects.register(parse_project_config(changed))
    assert "filtered with other prompts" in _refused(
        "calibrate", "export", "calib", str(tmp_path / "again")
    )
    assert "drawn for other prompts, another model" in _refused("calibrate", "show", "calib")
