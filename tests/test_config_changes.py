"""A changed config re-runs exactly what it changes.

A completed project is registered again with one section changed at a time, and driven as
`dataminer run` drives it. Each item's `finished_at` tells which work was done again: only the
stages whose fingerprint the change moved (ProjectConfig.fingerprints), and the stages after
them. New prompts and thresholds filter again from the embedding cache (no frame is embedded
again); a new extraction profile extracts again; a new output_dir receives the results; a run
setting (device, batch size) or a download setting redoes nothing.
"""

from __future__ import annotations

import pandas as pd
import pytest
import sqlalchemy as sa
import yaml

from dataminer_dagster.db.project_records import ProjectBusyError
from dataminer_dagster.db.reports import work_summary
from tests.helpers.project_runs import redone

pytestmark = pytest.mark.slow


def test_new_prompts_and_thresholds_filter_again_from_the_cache_and_redo_what_follows(changing):
    first = changing.run()
    members = [key for stage, key in first if stage == "filter"]
    assert len(members) == 2
    scores = pd.concat(
        pd.read_parquet(changing.output.filter_table(key.split(".")[1])) for key in members
    )["pos_max"]
    threshold = float(scores.median())

    result = changing.register(
        filter={"positive_prompts": ["a moving square"], "positive_threshold": threshold}
    )
    assert result.changed_keys == ("filter.positive_prompts", "filter.positive_threshold")
    assert result.stale_stages == ("filter", "dedup", "detect", "dataset")
    assert work_summary(changing.engine, result.project.id, 15).stale == {
        "filter": 2,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    second = changing.run()
    assert redone(first, second) == {"filter": 2, "dedup": 1, "detect": 1, "dataset": 1}
    assert work_summary(changing.engine, result.project.id, 15).stale == {}
    for key in members:  # from the cache: the model embedded no frame again
        outcome = changing.outcome("filter", key)
        assert outcome["embedded"] == 0 and outcome["frames"] > 0, outcome

    manifest = changing.manifest()
    assert len(manifest) > 0
    assert set(manifest["best_prompt"]) == {"a moving square"}
    assert (manifest["pos_max"] > threshold).all()
    table = pd.read_parquet(changing.output.filter_table(members[0].split(".")[1]))
    assert "positive: a moving square" in table and "positive: a shape" not in table

    # A setting of how the filter runs, not of what it keeps: nothing is done again.
    result = changing.register(filter={"batch_size": 3, "device": "cpu"})
    assert result.changed_keys == ("filter.batch_size",) and result.stale_stages == ()
    assert redone(second, changing.run()) == {}


def test_each_later_section_redoes_its_stage_and_what_follows_only(changing):
    done = changing.run()

    changing.register(dedup={"threshold": 0.995})
    after_dedup = changing.run()
    assert redone(done, after_dedup) == {"dedup": 1, "detect": 1, "dataset": 1}

    changing.register(detect={"confidence": 0.5})
    after_detect = changing.run()
    assert redone(after_dedup, after_detect) == {"detect": 1, "dataset": 1}

    # The dataset's own section (splits, formats, the report's thresholds): the dataset only.
    result = changing.register(dataset={"seed": 11, "formats": ["coco", "hf"], "dark_below": 60})
    assert result.changed_keys == ("dataset.dark_below", "dataset.formats", "dataset.seed")
    assert result.stale_stages == ("dataset",)
    after_dataset = changing.run()
    assert redone(after_detect, after_dataset) == {"dataset": 1}
    assert (changing.output.dataset_dir / "hf").is_dir()

    # A download setting applies to the downloads still to come: the files kept are used.
    result = changing.register(download={"max_height": 480})
    assert result.stale_stages == ()
    after_download = changing.run()
    assert redone(after_dataset, after_download) == {}

    # A new source: the catalog runs again and only the new video goes through the chain;
    # the project's dedup, detection and dataset then take it in.
    result = changing.register(inputs={"files": changing.clips})
    assert result.stale_stages == ("catalog",)
    after_inputs = changing.run()
    assert redone(after_download, after_inputs) == {
        "catalog": 1,
        "download": 1,
        "frames": 1,
        "filter": 1,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    assert changing.manifest()["video_id"].nunique() == 3


def test_a_new_extraction_profile_extracts_and_filters_again(changing):
    before = changing.run()
    frames_before = len(changing.manifest())
    old_profiles = changing.catalog.frames.profiles(None)
    assert len(old_profiles) == 2 and all(len(p) == 1 for p in old_profiles.values())

    result = changing.register(extract={"every_seconds": 0.25})
    assert result.stale_stages == ("filter", "dedup", "detect", "dataset")
    after = changing.run()
    assert redone(before, after) == {
        "frames": 2,
        "filter": 2,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }
    assert len(changing.manifest()) > frames_before  # twice the samples, every one kept
    # The old profile's frames go: no project uses them any more.
    for video_id, profiles in old_profiles.items():
        ((old_dir, _),) = profiles.values()
        assert not old_dir.exists()
        assert old_dir.parent.is_dir()
        assert list(changing.catalog.frames.profiles([video_id])[video_id]) != list(profiles)
    # A key of another strategy changes no frame: nothing runs again.
    result = changing.register(extract={"every_frames": 7})
    assert result.stale_stages == ()
    assert redone(after, changing.run()) == {}


def test_a_new_output_dir_receives_the_results(changing, tmp_path):
    # Two clips that are no near-duplicates of each other (at 0.99 the tiny random model finds
    # them alike): one per split, so that the YOLO export has its data.yaml.
    changing.register(
        dataset={"formats": ["yolo"], "splits": {"train": 0.5, "val": 0.5, "test": 0.0}},
        dedup={"threshold": 0.9999},
    )
    before = changing.run()
    old = changing.output
    images = sorted(p.name for p in (old.dataset_dir / "images").iterdir())
    assert images
    assert yaml.safe_load((old.dataset_dir / "yolo" / "data.yaml").read_text())["path"] == str(
        old.dataset_dir / "yolo"
    )

    new_dir = tmp_path / "elsewhere" / "changing"
    result = changing.register(output_dir=str(new_dir))
    assert result.moved_from == old.root and result.stale_stages == ()
    assert not old.root.exists()
    assert sorted(p.name for p in (new_dir / "dataset" / "images").iterdir()) == images
    # Ultralytics reads data.yaml's path as written: it names the new place
    data = yaml.safe_load((new_dir / "dataset" / "yolo" / "data.yaml").read_text())
    assert data["path"] == str(new_dir / "dataset" / "yolo")
    assert redone(before, changing.run()) == {}
    assert len(changing.manifest()) == len(images)


def test_the_output_dir_does_not_move_while_the_projects_work_runs(changing, tmp_path):
    changing.run()
    with changing.engine.begin() as c:
        c.execute(
            sa.text("""UPDATE dataminer.work_items SET status = 'running',
                               lease_token = gen_random_uuid(), lease_owner = 'a-run'
                         WHERE stage = 'dedup'""")
        )
    old = changing.output.root
    with pytest.raises(ProjectBusyError, match="output_dir cannot change while 1 of its work"):
        changing.register(output_dir=str(tmp_path / "elsewhere"))
    assert (old / "dataset").is_dir()
    assert changing.catalog.projects.get("changing").output_dir == old


def test_work_claimed_before_the_config_changed_is_done_again(changing):
    """The config changes while a filter item runs: the run claimed it under the earlier
    config, so when it completes the item is queued again (its results stand until then), and
    the project waits for it."""
    first = changing.run()
    key = next(k for s, k in first if s == "filter")
    (lease,), _ = changing.store.claim_keys("filter", [key], "a-run", redo=True)
    changing.register(filter={"positive_prompts": ["another shape"]})
    with changing.store.completing(lease, {"frames": 1}):
        pass
    with changing.engine.connect() as c:
        status = c.execute(
            sa.text(
                "SELECT status FROM dataminer.work_items WHERE stage = 'filter' AND item_key = :k"
            ),
            {"k": key},
        ).scalar_one()
    assert status == "pending"

    second = changing.run()
    assert redone(first, second)["filter"] == 2
    table = pd.read_parquet(changing.output.filter_table(key.split(".")[1]))
    assert "positive: another shape" in table


def test_dagster_shows_the_partitions_a_config_change_made_stale(changing):
    """Each project-level stage's asset depends on its config asset, whose data version is the
    stage's fingerprint: Dagster's own stale status (the UI's partition page) follows a change."""
    changing.run()
    assert changing.stale_in_dagster() == {}

    seen: list[dict[str, str]] = []
    changing.register(detect={"confidence": 0.5})
    changing.run(on_tick=lambda: seen.append(changing.stale_in_dagster()))
    # The first cycle observes the new versions, before any run: what the change made stale.
    assert seen[0] == {"detections": "STALE", "dataset": "STALE"}
    assert changing.stale_in_dagster() == {}, "done again, the partitions are fresh"

    seen.clear()
    changing.register(dataset={"seed": 11})
    changing.run(on_tick=lambda: seen.append(changing.stale_in_dagster()))
    assert seen[0] == {"dataset": "STALE"}

    seen.clear()
    changing.register(filter={"positive_prompts": ["a moving square"]})
    changing.run(on_tick=lambda: seen.append(changing.stale_in_dagster()))
    assert seen[0] == {"deduped_set": "STALE", "detections": "STALE", "dataset": "STALE"}
    assert changing.stale_in_dagster() == {}
