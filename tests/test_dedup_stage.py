"""The dedup stage against a real project: a frame that can no longer be read, when its embedding
(or, under dedup.colour_overlap, its colour histogram) is not cached, is recorded and left out
instead of failing the project (issue 13, item 4)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest

from dataminer_dagster.acquisition.video_ids import video_id_for_file
from dataminer_dagster.assets.dedup import asset as dedup_asset
from dataminer_dagster.assets.dedup.colour_check import colour_histograms
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.embedding_cache import EmbeddingCache
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery
from dataminer_dagster.models.image_embedder import ImageBatchResult
from dataminer_dagster.paths import DataPaths, ProjectPaths
from dataminer_dagster.registry import CATALOG, DEDUP, DOWNLOAD, FILTER, FRAMES
from dataminer_dagster.resources.models import ModelsResource
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.pipeline import materialize_partitions, resources, work_items
from tests.helpers.stages import STAGES

pytestmark = pytest.mark.slow


class RecordingModels(ModelsResource):
    """The product's models, with a record of what the stages asked for."""

    asked: ClassVar[list[str]] = []

    def scorer(self, config):
        self.asked.append(f"scorer {config.model}")
        return super().scorer(config)


def _record_histogram_reads(monkeypatch) -> list[str]:
    """The frame files the dedup stage reads for their colour histograms, from now on."""
    read: list[str] = []

    def recording(paths):
        read.extend(str(path) for path in paths)
        return colour_histograms(paths)

    monkeypatch.setattr(dedup_asset, "colour_histograms", recording)
    return read


def _materialize(engine, instance, data_dir: Path, database_url: str, stage: str, **extra):
    for name, keys in plan_discovery(engine, DiscoveryCursor()).additions.items():
        instance.add_dynamic_partitions(name, keys)
    asset = STAGES[stage]
    return materialize_partitions(
        [asset],
        list(work_items(engine, stage)),
        instance=instance,
        resources=resources(database_url, data_dir, **extra),
        partitions=asset.partitions_def,
        raise_on_error=False,
    )


@pytest.mark.parametrize("not_cached", ["embedding", "colour histogram", "both"])
def test_an_unreadable_frame_without_a_cached_embedding_is_recorded_and_skipped(
    tmp_path, database_url, engine, tiny_siglip, not_cached, monkeypatch
):
    spec = SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,))
    video = write_opencv_video(tmp_path / "clip.mp4", spec)
    data_dir = tmp_path / "data"
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
    config = parse_project_config(
        {
            "name": "shaky",
            "output_dir": str(tmp_path / "out"),
            "inputs": {"files": [str(video)]},
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(tiny_siglip),
            "dedup": {"threshold": 0.999}
            | ({"colour_overlap": 0.8} if not_cached != "embedding" else {}),
        }
    )
    catalog.projects.register(config)
    paths = ProjectPaths(tmp_path / "out")
    with instance_for_test() as instance:
        for stage in (CATALOG, DOWNLOAD, FRAMES, FILTER):
            assert _materialize(engine, instance, data_dir, database_url, stage).success
        passed = pd.read_parquet(paths.filter_table(video_id_for_file(video)))
        passed = passed[passed["passed"]].reset_index(drop=True)
        assert len(passed) >= 3
        # The embeddings' cache is gone (another model, or removed), or the colour histograms were
        # never computed (the filter does not), and one passed frame is now corrupt.
        if not_cached != "colour histogram":
            shutil.rmtree(DataPaths(data_dir).embeddings_dir())
        broken = Path(passed["file"][1])
        broken.chmod(0o644)
        broken.write_bytes(b"not an image any more")
        RecordingModels.asked.clear()
        histogram_reads = _record_histogram_reads(monkeypatch)
        result = _materialize(
            engine, instance, data_dir, database_url, DEDUP, models=RecordingModels()
        )

    assert result.success
    # Without the cache, dedup embedded with the filter's model, from the `models` resource.
    embedded = [f"scorer {tiny_siglip}"] if not_cached != "colour histogram" else []
    assert RecordingModels.asked == embedded
    # A frame the embedding found unreadable is not read again for its colours.
    if not_cached == "embedding":
        assert histogram_reads == []
    else:
        expected = set(passed["file"]) - ({str(broken)} if not_cached == "both" else set())
        assert set(histogram_reads) == expected
    assert work_items(engine, DEDUP)["shaky"].status == "done"
    [materialization] = result.get_asset_materialization_events()
    assert materialization.materialization.metadata["unreadable"].value == 1
    table = pd.read_parquet(paths.dedup_table).set_index("file")
    assert len(table) == len(passed)  # every passed frame is listed, the broken one too
    row = table.loc[str(broken)]
    assert not row["readable"] and not row["kept"]
    assert row["group"] == -1 and row["group_size"] == 0
    assert "not a readable JPEG, PNG or WebP image" in row["error"]
    rest = table.drop(index=str(broken))
    assert rest["readable"].all() and rest["error"].isna().all()
    assert (rest["group"] >= 0).all() and rest["kept"].sum() >= 1
    # Group ids number the kept frames 0..G-1 and every readable frame is in one.
    assert sorted(rest.loc[rest["kept"], "group"]) == list(range(rest["kept"].sum()))


def test_rows_of_a_video_whose_every_frame_is_known_unreadable_are_zeros(tmp_path):
    frames = pd.DataFrame(
        {
            "video_id": ["a", "a", "b"],
            "content_hash": ["a0", "a1", "b0"],
            "file": ["a0.jpg", "a1.jpg", "b0.jpg"],
        }
    )
    asked: list[str] = []

    def compute(files):
        asked.extend(files)
        return ImageBatchResult(np.arange(len(files)), np.ones((len(files), 3), np.float32))

    cache = EmbeddingCache(tmp_path, "test-model")
    rows, unreadable = dedup_asset._cached_per_frame(cache, frames, compute, known_unreadable={2})

    assert asked == ["a0.jpg", "a1.jpg"]  # b0.jpg is not read again
    assert unreadable == {}
    assert rows.shape == (3, 3) and rows.dtype == np.float32
    assert (rows[:2] > 0).all() and (rows[2] == 0).all()
