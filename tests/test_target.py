"""A target dataset size (issue 27, items 3 and 4): a project keeps acquiring in rounds until its
dataset holds `target.images`, its budget is spent or its sources are exhausted, says which, and
spends its downloads on the source whose videos keep the most frames. Two feeds on 127.0.0.1 read
by real yt-dlp: one of short clips (one frame kept each), one of long clips (several each)."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from dataminer_dagster.assets.catalog.source_choice import SourceYield, choose
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.acquisition_rounds import continue_acquisition
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test, keep_every_frame
from tests.helpers.http_server import http_server_fixture
from tests.helpers.pipeline import drive_quietly, pipeline_definitions, resources, write_videos

http_server = http_server_fixture()

pytestmark = pytest.mark.slow


def feed(server, name: str, clips: list[str]) -> str:
    items = "".join(
        f"<item><title>{c}</title><link>{server.url('/' + c)}</link></item>" for c in clips
    )
    (server.root / name).write_text(
        '<?xml version="1.0"?><rss version="2.0"><channel><title>t</title>'
        f"<link>{server.url('/')}</link><description>d</description>{items}</channel></rss>"
    )
    return server.url("/" + name)


def clips(server, prefix: str, count: int, seconds: float) -> list[str]:
    specs = {
        f"{prefix}{i}.mp4": SyntheticVideoSpec(
            width=64, height=48, fps=10, seconds=seconds, seed=100 * len(prefix) + i
        )
        for i in range(count)
    }
    write_videos(server.root, specs)
    return list(specs)


def run_project(tmp_path, database_url, engine, server, siglip, *, per_feed: int, target: dict):
    short = feed(server, "short.xml", clips(server, "short", per_feed, 0.4))
    long = feed(server, "long.xml", clips(server, "long", per_feed, 3.0))
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    config = parse_project_config(
        {
            "name": "aims",
            "output_dir": str(tmp_path / "out"),
            "inputs": {"listings": [short, long], "max_per_listing": 2},
            "download": {"allow_private_networks": True},  # served on 127.0.0.1
            "target": target,
            "extract": {"strategy": "time", "every_seconds": 0.5},
            "filter": keep_every_frame(siglip, ["a shape"]),
            "dedup": {"threshold": 0.99999},
        }
    )
    catalog.projects.register(config)
    defs = pipeline_definitions(resources(database_url, tmp_path / "data"))
    with instance_for_test() as instance:
        result = drive_quietly(["aims"], instance=instance, defs=defs, store=LeaseStore(engine))
        observed = [
            e.asset_observation.metadata["acquisition"].value
            for e in instance.fetch_observations(dg.AssetKey("dataset"), limit=100).records
        ]
    assert result.stages == {"aims": "complete"}, result
    with engine.connect() as c:
        state = c.execute(sa.text("SELECT acquisition FROM dataminer.projects")).scalar_one()
        linked = c.execute(
            sa.text("SELECT video_id FROM dataminer.project_videos ORDER BY id")
        ).scalars()
        linked = list(linked)
    return state, linked, observed


def test_the_project_acquires_until_its_target_from_the_better_source(
    tmp_path, database_url, engine, http_server, tiny_siglip, dataminer_env, monkeypatch
):
    monkeypatch.setenv("DATAMINER_DATA_DIR", str(tmp_path / "data"))  # the pipeline's, below
    state, linked, observed = run_project(
        tmp_path, database_url, engine, http_server, tiny_siglip, per_feed=6, target={"images": 20}
    )
    assert state["state"] == "reached", state
    assert state["round"] >= 1
    from_long = sum(v.startswith("long") for v in linked)
    from_short = sum(v.startswith("short") for v in linked)
    assert from_short == 1  # tried once (round 0), then left for the source that keeps more
    assert from_long > from_short
    assert any(o.startswith("acquisition reached") for o in observed), observed

    out = CliRunner().invoke(main_cli(), ["status", "aims", "--json"]).output
    report = json.loads(out)
    assert report["target"]["state"] == "reached"
    assert report["target"]["dataset_images"] >= 20
    assert [y["source"].split(": ")[1].rsplit("/", 1)[1] for y in report["yield"]] == [
        "long.xml",
        "short.xml",
    ]  # the best yield first
    text = CliRunner().invoke(main_cli(), ["status", "aims"]).output
    assert "target: " in text and "of 20 images; reached" in text

    # A raised target on the finished project starts a round at once, its dataset unchanged.
    catalog = Catalog(engine, LeaseStore(engine), DataPaths(tmp_path / "data"))
    config = catalog.projects.get("aims").config
    catalog.projects.register(
        config.model_copy(update={"target": config.target.model_copy(update={"images": 1000})})
    )
    [(name, decision)] = continue_acquisition(LeaseStore(engine))
    assert name == "aims" and decision.startswith(f"acquisition round {state['round'] + 1}: ")
    assert continue_acquisition(LeaseStore(engine)) == []  # decided once


def test_a_spent_budget_and_exhausted_sources_stop_the_project_and_say_so(
    tmp_path, database_url, engine, http_server, tiny_siglip
):
    state, linked, _ = run_project(
        tmp_path,
        database_url,
        engine,
        http_server,
        tiny_siglip,
        per_feed=6,
        target={"images": 1000, "max_videos": 3},
    )
    assert state["state"] == "budget spent" and "max_videos (3)" in state["reason"], state
    assert len(linked) == 3


def test_sources_with_nothing_new_exhaust_the_acquisition(
    tmp_path, database_url, engine, http_server, tiny_siglip
):
    state, linked, _ = run_project(
        tmp_path,
        database_url,
        engine,
        http_server,
        tiny_siglip,
        per_feed=2,
        target={"images": 1000},
    )
    assert state["state"] == "exhausted", state
    assert len(linked) == 4


def main_cli():
    from dataminer_dagster.cli import main

    return main


def test_untried_sources_come_first_then_the_best_yield():
    candidates = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"], "c": ["c1", "c2"]}
    # nothing known: each source once, then the first round's worth (at most half of them)
    assert choose(candidates, {}, need=100) == ["a1", "b1", "c1", "a2"]
    # b keeps ten times what a keeps, c is untried: c once, then b
    yields = {"a": SourceYield(4, 4), "b": SourceYield(4, 40)}
    assert choose(candidates, yields, need=20) == ["c1", "b1", "b2"]
    # in list order, by the same count
    assert choose(candidates, yields, need=20, by_yield=False) == ["a1", "a2", "a3", "b1"]


def test_a_round_takes_what_the_target_still_needs_within_the_budget():
    candidates = {"a": [f"a{i}" for i in range(20)]}
    yields = {"a": SourceYield(10, 40)}  # about 4 frames a video
    assert len(choose(candidates, yields, need=12)) == 3
    assert len(choose(candidates, yields, need=100)) == 10  # half the candidates
    assert len(choose(candidates, yields, need=100, limit=2)) == 2  # the budget
    assert choose(candidates, yields, need=0) == []
