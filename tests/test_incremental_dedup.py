"""Incremental dedup (issue 27, item 2) in a real project: frames of a video added later are
compared with the frames already kept and with each other; earlier kept frames stay kept. A
changed dedup setting and `force-dedup` group every frame again."""

from __future__ import annotations

import pandas as pd
import pytest

from dataminer_dagster.core.kept_index import KeptIndex
from dataminer_dagster.db.project_lifecycle import force_stage
from dataminer_dagster.engine.registry import DEDUP
from tests.conftest import ONE_SERVER

pytestmark = pytest.mark.slow


def dedup_outcome(project) -> dict:
    return project.outcome("dedup", "changing")


def table(project) -> pd.DataFrame:
    return pd.read_parquet(project.output.dedup_table)


def index(project) -> KeptIndex:
    config = project.catalog.project("changing").config
    found = KeptIndex.open(project.output.dedup_index_dir, config.fingerprints()[DEDUP])
    assert found is not None
    return found


@ONE_SERVER
def test_a_new_video_is_deduplicated_against_the_kept_frames_only(changing):
    changing.run()
    assert dedup_outcome(changing)["mode"] == "every frame"
    before = table(changing)
    kept_before = set(before.loc[before["kept"], "frame_id"])
    assert set(index(changing).frame_ids()) == kept_before

    changing.register(inputs={"files": changing.clips})  # a third clip
    changing.run()

    outcome = dedup_outcome(changing)
    after = table(changing)
    new_frames = after[~after["frame_id"].isin(before["frame_id"])]
    assert outcome["mode"] == "new frames only"
    assert outcome["new_frames"] == len(new_frames) > 0
    assert new_frames["video_id"].nunique() == 1
    # The earlier rows are unchanged: the kept frames stay kept, in the same groups.
    pd.testing.assert_frame_equal(
        after[after["frame_id"].isin(before["frame_id"])].reset_index(drop=True)[
            ["frame_id", "group", "kept"]
        ],
        before[["frame_id", "group", "kept"]],
    )
    kept_after = set(after.loc[after["kept"], "frame_id"])
    assert kept_before <= kept_after
    assert set(index(changing).frame_ids()) == kept_after
    # Every group has exactly one kept frame, and the sizes count the members.
    assert (after[after["group"] >= 0].groupby("group")["kept"].sum() == 1).all()
    assert (after.groupby("group")["frame_id"].transform("size") == after["group_size"]).all()
    assert outcome["kept"] == len(kept_after)
    assert len(changing.manifest()) == len(kept_after)


@ONE_SERVER
def test_a_changed_threshold_and_force_dedup_group_every_frame_again(changing):
    changing.run()
    changing.register(dedup={"threshold": 0.995})
    changing.run()
    assert dedup_outcome(changing)["mode"] == "every frame"
    assert index(changing).size == int(table(changing)["kept"].sum())

    force_stage(changing.catalog, "changing", DEDUP)
    assert not changing.output.dedup_index_dir.exists()
    changing.run()
    assert dedup_outcome(changing)["mode"] == "every frame"


@ONE_SERVER
def test_incremental_off_groups_every_frame_each_time(changing):
    changing.register(dedup={"incremental": False})
    changing.run()
    changing.register(inputs={"files": changing.clips})
    changing.run()
    outcome = dedup_outcome(changing)
    assert outcome["mode"] == "every frame"
    assert outcome["new_frames"] == outcome["frames_in"]
