"""`dataminer run X` works on X alone, and stops when its deadline passes, even inside a run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import (
    drive_quietly,
    pipeline_definitions,
    resources,
    work_items,
    write_videos,
)

pytestmark = pytest.mark.slow


def _config(name: str, urls: list[str], model: Path, out: Path):
    return parse_project_config(
        {
            "name": name,
            "output_dir": str(out / name),
            "inputs": {"urls": urls},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": {"model": str(model), "device": "cpu", "positive_prompts": ["a shape"]},
        }
    )


def test_run_drives_only_its_project_and_stops_at_its_deadline(
    tmp_path, database_url, engine, tiny_siglip
):
    www = tmp_path / "www"
    write_videos(
        www,
        {
            f"{name}.mp4": SyntheticVideoSpec(width=96, height=64, fps=10, seconds=1.0, seed=i)
            for i, name in enumerate(("mine", "slow0", "slow1", "slow2"))
        },
    )
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    defs = pipeline_definitions(resources(database_url, data_dir))
    with LocalHTTPServer(www) as server, instance_for_test() as instance:
        slow = [f"/slow{i}.mp4" for i in range(3)]
        for path in slow:
            server.delay(path, seconds=3)
        catalog.projects.register(
            _config("other", [server.url(p) for p in slow], tiny_siglip, tmp_path)
        )
        catalog.projects.register(_config("mine", [server.url("/mine.mp4")], tiny_siglip, tmp_path))

        result = drive_quietly(["mine"], instance=instance, defs=defs, store=store, timeout_s=120)
        assert result.stages == {"mine": "complete"}
        assert not any(server.hits(p) for p in slow), "another project's videos were fetched"
        assert catalog.projects.get("other").stage == "active"
        assert work_items(engine, "catalog")["other"].status == "pending"

        # Three downloads of 3 s each in one run: the deadline passes during one of them, and
        # the run starts no other.
        with pytest.raises(TimeoutError, match="not finished after 5 s"):
            drive_quietly(["other"], instance=instance, defs=defs, store=store, timeout_s=5)
        downloads = {k: r.status for k, r in work_items(engine, "download").items()}
        slow_statuses = sorted(s for k, s in downloads.items() if k.startswith("slow"))
        assert len(slow_statuses) == 3 and slow_statuses.count("pending") >= 1, slow_statuses


def test_a_dead_item_is_said_in_one_line_without_a_stack(
    tmp_path, database_url, engine, capfd, monkeypatch
):
    """Dagster's console lines about the run's failure printed, under the reason the stage gave,
    the stack of the code that raised it, as if the product had crashed
    (hosting/described_failures.py). They reach the terminal whatever becomes of the run's
    captured standard error, which Dagster mirrors back with `tail -F` and stops when the steps
    end: here a `tail` that mirrors nothing, as a late one does with the last lines; what else
    the run wrote to standard error is read from its compute-log files."""
    late_mirror = tmp_path / "bin"
    late_mirror.mkdir()
    (late_mirror / "tail").write_text("#!/bin/sh\nexec sleep 600\n")
    (late_mirror / "tail").chmod(0o755)
    monkeypatch.setenv("PATH", f"{late_mirror}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "www").mkdir()
    data_dir = tmp_path / "data"
    store = LeaseStore(engine)
    catalog = Catalog(engine, store, DataPaths(data_dir))
    defs = pipeline_definitions(resources(database_url, data_dir))
    with LocalHTTPServer(tmp_path / "www") as server, instance_for_test() as instance:
        server.respond("/missing.mp4", status=404)
        catalog.projects.register(
            _config("p", [server.url("/missing.mp4")], tmp_path / "model", tmp_path)
        )
        result = drive_quietly(["p"], instance=instance, defs=defs, store=store, timeout_s=120)
        captured = {path: path.read_text() for path in Path(instance.root_directory).rglob("*.err")}
    assert result.stages == {"p": "failed"}
    shown = capfd.readouterr().err
    [step] = [line for line in shown.splitlines() if " - STEP_FAILURE - " in line]
    [run] = [line for line in shown.splitlines() if " - RUN_FAILURE - " in line]
    for line in (step, run):
        assert "failed on attempt 1: " in line and "404" in line and "dead:" in line, line
    assert "Stack Trace" not in shown and "Traceback" not in shown, shown
    assert captured, "the runs' standard error was not captured"
    for path, text in captured.items():
        assert "Traceback" not in text, (path, text)
