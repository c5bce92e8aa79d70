"""A changed config re-runs exactly what it changes.

A completed project is registered again with one section changed at a time, and driven as
`dataminer run` drives it. Each item's `finished_at` tells which work was done again: only the
stages whose fingerprint the change moved (ProjectConfig.fingerprints), and the stages after
them. New prompts and thresholds filter again from the embedding cache (no frame is embedded
again); a new extraction profile extracts again; a new output_dir receives the results; a run
setting (device, batch size) or a download setting redoes nothing.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_records import ProjectBusyError
from dataminer_dagster.db.reports import stale_counts
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.testing import keep_every_frame
from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources, write_videos

pytestmark = pytest.mark.slow

STAGES = ("catalog", "download", "frames", "filter", "dedup", "detect", "dataset")


@pytest.fixture(scope="module")
def yolo(tmp_path_factory) -> Path:
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    return build_tiny_yolo(tmp_path_factory.mktemp("models") / "yolo.pt")


class Project:
    """One project over local clips, its catalog, and a Dagster instance to drive it with."""

    def __init__(self, tmp_path: Path, database_url: str, engine, siglip: Path, yolo: Path):
        clips = write_videos(
            tmp_path / "videos",
            {
                f"clip{i}.mp4": SyntheticVideoSpec(
                    width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=i
                )
                for i in range(3)
            },
        )
        self.clips = [str(p) for p in clips.values()]
        self.engine = engine
        self.store = LeaseStore(engine)
        self.catalog = Catalog(engine, self.store, DataPaths(tmp_path / "data"))
        self.defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
        self.raw = {
            "name": "changing",
            "output_dir": str(tmp_path / "out" / "changing"),
            "inputs": {"files": self.clips[:2]},
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(siglip, ["a shape"]),
            "dedup": {"threshold": 0.99},
            "detect": {"detector": "yolo", "model": str(yolo), "device": "cpu", "confidence": 0.01},
        }
        self.instance = None

    def register(self, **sections):
        for key, value in sections.items():
            self.raw[key] = {**self.raw.get(key, {}), **value} if isinstance(value, dict) else value
        return self.catalog.register_project(parse_project_config(self.raw))

    def run(self) -> dict[tuple[str, str], object]:
        """Drive the project to complete; returns what each item's finished_at is now."""
        result = drive_quietly(
            ["changing"], instance=self.instance, defs=self.defs, store=self.store
        )
        assert result.stages == {"changing": "complete"}, result
        return self.finished()

    def finished(self) -> dict[tuple[str, str], object]:
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text("SELECT stage, item_key, status, finished_at FROM dataminer.work_items")
            ).all()
        assert all(r.status == "done" for r in rows), [r for r in rows if r.status != "done"]
        return {(r.stage, r.item_key): r.finished_at for r in rows}

    def outcome(self, stage: str, key: str) -> dict:
        with self.engine.connect() as c:
            return c.execute(
                sa.text(
                    "SELECT outcome FROM dataminer.work_items WHERE stage = :s AND item_key = :k"
                ),
                {"s": stage, "k": key},
            ).scalar_one()

    @property
    def output(self) -> ProjectPaths:
        return ProjectPaths(Path(self.catalog.project("changing").output_dir))

    def manifest(self) -> pd.DataFrame:
        return pd.read_parquet(self.output.dataset_dir / "manifest.parquet")


def redone(before: dict, after: dict) -> dict[str, int]:
    """{stage: items done again (or new)} between two snapshots of finished_at."""
    counts = dict.fromkeys(STAGES, 0)
    for (stage, key), at in after.items():
        if before.get((stage, key)) != at:
            counts[stage] += 1
    return {stage: n for stage, n in counts.items() if n}


@pytest.fixture
def project(tmp_path, database_url, engine, tiny_siglip, yolo):
    changing = Project(tmp_path, database_url, engine, tiny_siglip, yolo)
    changing.register()
    with dg.instance_for_test() as instance:
        changing.instance = instance
        yield changing


def test_new_prompts_and_thresholds_filter_again_from_the_cache_and_redo_what_follows(project):
    first = project.run()
    members = [key for stage, key in first if stage == "filter"]
    assert len(members) == 2
    scores = pd.concat(
        pd.read_parquet(project.output.filter_table(key.split(".")[1])) for key in members
    )["pos_max"]
    threshold = float(scores.median())

    result = project.register(
        filter={"positive_prompts": ["a moving square"], "positive_threshold": threshold}
    )
    assert result.changed_keys == ("filter.positive_prompts", "filter.positive_threshold")
    assert result.stale_stages == ("filter", "dedup", "detect", "dataset")
    assert stale_counts(project.engine, result.project.id) == {
        "filter": 2,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    second = project.run()
    assert redone(first, second) == {"filter": 2, "dedup": 1, "detect": 1, "dataset": 1}
    assert stale_counts(project.engine, result.project.id) == {}
    for key in members:  # from the cache: the model embedded no frame again
        outcome = project.outcome("filter", key)
        assert outcome["embedded"] == 0 and outcome["frames"] > 0, outcome

    manifest = project.manifest()
    assert len(manifest) > 0
    assert set(manifest["best_prompt"]) == {"a moving square"}
    assert (manifest["pos_max"] > threshold).all()
    table = pd.read_parquet(project.output.filter_table(members[0].split(".")[1]))
    assert "positive: a moving square" in table and "positive: a shape" not in table

    # A setting of how the filter runs, not of what it keeps: nothing is done again.
    result = project.register(filter={"batch_size": 3, "device": "cpu"})
    assert result.changed_keys == ("filter.batch_size",) and result.stale_stages == ()
    assert redone(second, project.run()) == {}


def test_each_later_section_redoes_its_stage_and_what_follows_only(project):
    done = project.run()

    project.register(dedup={"threshold": 0.995})
    after_dedup = project.run()
    assert redone(done, after_dedup) == {"dedup": 1, "detect": 1, "dataset": 1}

    project.register(detect={"confidence": 0.5})
    after_detect = project.run()
    assert redone(after_dedup, after_detect) == {"detect": 1, "dataset": 1}

    # A download setting applies to the downloads still to come: the files kept are used.
    result = project.register(download={"max_height": 480})
    assert result.stale_stages == ()
    after_download = project.run()
    assert redone(after_detect, after_download) == {}

    # A new source: the catalog runs again and only the new video goes through the chain;
    # the project's dedup, detection and dataset then take it in.
    result = project.register(inputs={"files": project.clips})
    assert result.stale_stages == ("catalog",)
    after_inputs = project.run()
    assert redone(after_download, after_inputs) == {
        "catalog": 1,
        "download": 1,
        "frames": 1,
        "filter": 1,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    assert project.manifest()["video_id"].nunique() == 3


def test_a_new_extraction_profile_extracts_and_filters_again(project):
    before = project.run()
    frames_before = len(project.manifest())
    old_profiles = project.catalog.frame_profiles(None)
    assert len(old_profiles) == 2 and all(len(p) == 1 for p in old_profiles.values())

    result = project.register(extract={"every_seconds": 0.25})
    assert result.stale_stages == ("filter", "dedup", "detect", "dataset")
    after = project.run()
    assert redone(before, after) == {
        "frames": 2,
        "filter": 2,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    assert len(project.manifest()) > frames_before  # twice the samples, every one kept
    # The old profile's frames go: no project uses them any more.
    for video_id, profiles in old_profiles.items():
        ((old_dir, _),) = profiles.values()
        assert not old_dir.exists()
        assert old_dir.parent.is_dir()
        assert list(project.catalog.frame_profiles([video_id])[video_id]) != list(profiles)
    # A key of another strategy changes no frame: nothing runs again.
    result = project.register(extract={"every_frames": 7})
    assert result.stale_stages == ()
    assert redone(after, project.run()) == {}


def test_a_new_output_dir_receives_the_results(project, tmp_path):
    before = project.run()
    old = project.output
    images = sorted(p.name for p in (old.dataset_dir / "images").iterdir())
    assert images

    new_dir = tmp_path / "elsewhere" / "changing"
    result = project.register(output_dir=str(new_dir))
    assert result.moved_from == old.root and result.stale_stages == ()
    assert not old.root.exists()
    assert sorted(p.name for p in (new_dir / "dataset" / "images").iterdir()) == images
    assert redone(before, project.run()) == {}
    assert len(project.manifest()) == len(images)


def test_the_output_dir_does_not_move_while_the_projects_work_runs(project, tmp_path):
    project.run()
    with project.engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'running',
                               lease_token = gen_random_uuid(), lease_owner = 'a-run'
                         WHERE stage = 'dedup'""")
        )
    old = project.output.root
    with pytest.raises(ProjectBusyError, match="output_dir cannot change while 1 of its work"):
        project.register(output_dir=str(tmp_path / "elsewhere"))
    assert (old / "dataset").is_dir()
    assert project.catalog.project("changing").output_dir == old


def test_work_claimed_before_the_config_changed_is_done_again(project):
    """The config changes while a filter item runs: the run claimed it under the earlier
    config, so when it completes the item is queued again (its results stand until then), and
    the project waits for it."""
    first = project.run()
    key = next(k for s, k in first if s == "filter")
    (lease,), _ = project.store.claim_keys("filter", [key], "a-run", redo=True)
    project.register(filter={"positive_prompts": ["another shape"]})
    with project.store.completing(lease, {"frames": 1}):
        pass
    with project.engine.connect() as c:
        status = c.execute(
            sa.text(
                "SELECT status FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k"
            ),
            {"k": key},
        ).scalar_one()
    assert status == "pending"

    second = project.run()
    assert redone(first, second)["filter"] == 2
    table = pd.read_parquet(project.output.filter_table(key.split(".")[1]))
    assert "positive: another shape" in table
