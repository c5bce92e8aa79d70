"""A project over local clips driven as `dataminer run` drives it, and what each item's
`finished_at` says about the work a change made run again (tests of config changes and redo)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources, write_videos

STAGES = ("catalog", "download", "frames", "filter", "dedup", "detect", "dataset")


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
        self.resources = resources(database_url, tmp_path / "data")
        self.defs = pipeline_definitions(self.resources)
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
        return self.catalog.projects.register(parse_project_config(self.raw))

    def run(self, on_tick=lambda: None) -> dict[tuple[str, str], object]:
        """Drive the project to complete; returns what each item's finished_at is now.
        `on_tick`: called after each planning cycle (its observations reported), before its runs."""
        result = drive_quietly(
            ["changing"], instance=self.instance, defs=self.defs, store=self.store, on_tick=on_tick
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

    def stale_in_dagster(self) -> dict[str, str]:
        """{asset: Dagster's stale status} of the project's partitions that are not fresh, as the
        UI's partition page resolves it."""
        from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
        from dagster._core.loader import LoadingContextForTest

        graph = self.defs.get_repository_def().asset_graph
        resolver = CachingStaleStatusResolver(
            self.instance, graph, LoadingContextForTest(self.instance)
        )
        statuses = {
            name: resolver.get_status(dg.AssetKey(name), "changing")
            for name in ("video_catalog", "deduped_set", "detections", "dataset")
        }
        return {name: s.value for name, s in statuses.items() if s != StaleStatus.FRESH}

    @property
    def output(self) -> ProjectPaths:
        return ProjectPaths(Path(self.catalog.projects.get("changing").output_dir))

    def manifest(self) -> pd.DataFrame:
        return pd.read_parquet(self.output.dataset_dir / "manifest.parquet")


def dataminer(*args: str) -> str:
    """The `dataminer` command in this process; its output, which must end in success."""
    from click.testing import CliRunner

    from dataminer_dagster.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def redone(before: dict, after: dict) -> dict[str, int]:
    """{stage: items done again (or new)} between two snapshots of finished_at."""
    counts = dict.fromkeys(STAGES, 0)
    for (stage, key), at in after.items():
        if before.get((stage, key)) != at:
            counts[stage] += 1
    return {stage: n for stage, n in counts.items() if n}


@pytest.fixture(scope="module")
def tiny_yolo(tmp_path_factory) -> Path:
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    return build_tiny_yolo(tmp_path_factory.mktemp("models") / "yolo.pt")


@pytest.fixture
def changing(tmp_path, database_url, engine, tiny_siglip, tiny_yolo):
    """The project `changing` registered, with a Dagster instance to drive it (its event log in
    this process's memory)."""
    yield from _registered(Project(tmp_path, database_url, engine, tiny_siglip, tiny_yolo))


@pytest.fixture
def changing_shared(tmp_path, database_url, engine, tiny_siglip, tiny_yolo):
    """`changing` driven on Dagster's own instance storage, which the commands a test runs open
    again through DAGSTER_HOME and record their runs in too."""
    yield from _registered(
        Project(tmp_path, database_url, engine, tiny_siglip, tiny_yolo), dg.instance_for_test
    )


def _registered(project: Project, instance_for=instance_for_test) -> Iterator[Project]:
    project.register()
    with instance_for() as instance:
        project.instance = instance
        yield project
