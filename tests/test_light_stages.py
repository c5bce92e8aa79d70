"""Sensors, catalog, downloads and frames never pay for torch, transformers or ultralytics."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

HEAVY = ("torch", "transformers", "ultralytics")

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import dagster as dg

    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from tests.helpers.stages import LANE_ASSETS, STAGES
    from dataminer_dagster.resources.download_client import YtDlpClient
    from dataminer_dagster.resources.models import ModelsResource
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.resources.db import DatabaseResource
    from dataminer_dagster.engine.discovery import DiscoveryCursor, plan_discovery

    url, tmp = sys.argv[1], Path(sys.argv[2])
    video = write_opencv_video(tmp / "clip.mp4", SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.0))
    engine = get_engine(url)
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp / "data"))
    config = parse_project_config({"name": "p", "inputs": {"files": [str(video)]},
                                   "filter": {"positive_prompts": ["x"]}})
    catalog.projects.register(config)
    resources = {"db": DatabaseResource(database_url=url, data_dir=str(tmp / "data")), "download_client": YtDlpClient(), "models": ModelsResource()}
    with dg.instance_for_test() as instance:
        for stage in ("catalog", "download", "frames"):
            found = plan_discovery(engine, DiscoveryCursor())
            for name, keys in found.additions.items():
                existing = set(instance.get_dynamic_partitions(name))
                instance.add_dynamic_partitions(name, [k for k in keys if k not in existing])
            asset = STAGES[stage]
            keys = instance.get_dynamic_partitions(asset.partitions_def.name)
            tags = {"dagster/asset_partition_range_start": keys[0], "dagster/asset_partition_range_end": keys[-1]}
            result = dg.materialize(list(LANE_ASSETS.values()), selection=[asset.key], instance=instance, tags=tags, resources=resources)
            assert result.success and result.get_asset_materialization_events(), stage
    print(" ".join(m for m in HEAVY if m in sys.modules) or "none")
    """
).replace("HEAVY", repr(HEAVY))


def test_video_stages_do_not_import_heavy_libraries(database_url, tmp_path):
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT, database_url, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == "none"
