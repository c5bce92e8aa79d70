"""Incremental dedup (issue 27, item 2) in a real project: frames of a video added later are
compared with the frames already kept and with each other; earlier kept frames stay kept. A
changed dedup setting and `force-dedup` group every frame again; with `dedup.replace: better` a
better new duplicate takes a kept frame's place."""

from __future__ import annotations

import dagster as dg
import pandas as pd
import pytest

from dataminer_dagster.assets.dedup.colour_check import BINS
from dataminer_dagster.assets.dedup.kept_index import KeptIndex
from dataminer_dagster.core.synthetic import SyntheticVideoSpec
from dataminer_dagster.db.project_lifecycle import force_stage
from dataminer_dagster.registry import DEDUP
from tests.helpers.pipeline import write_videos

pytestmark = pytest.mark.slow


def dedup_outcome(project) -> dict:
    return project.outcome("dedup", "changing")


def table(project) -> pd.DataFrame:
    return pd.read_parquet(project.output.dedup_table)


def index(project) -> KeptIndex:
    config = project.catalog.projects.get("changing").config
    found = KeptIndex.open(project.output.dedup_index_dir, config.fingerprints()[DEDUP])
    assert found is not None
    return found


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


def test_incremental_off_groups_every_frame_each_time(changing):
    changing.register(dedup={"incremental": False})
    changing.run()
    changing.register(inputs={"files": changing.clips})
    changing.run()
    outcome = dedup_outcome(changing)
    assert outcome["mode"] == "every frame"
    assert outcome["new_frames"] == outcome["frames_in"]


def test_with_replace_better_a_better_new_duplicate_takes_the_kept_frames_place(changing, tmp_path):
    """dedup.replace: better. A video added later holds the first clip again with other noise:
    its frames duplicate kept ones, some with a higher filter score. The best new frame of a
    group replaces the group's kept frame when it scores higher; otherwise the kept one stays."""
    changing.register(dedup={"replace": "better", "replace_margin": 0.0})
    changing.run()
    before = table(changing)
    again = write_videos(
        tmp_path / "again",
        {
            "clip0-again.mp4": SyntheticVideoSpec(
                width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=0, noise=13
            )
        },
    )
    changing.register(inputs={"files": [*changing.clips[:2], str(again["clip0-again.mp4"])]})
    changing.run()

    outcome = dedup_outcome(changing)
    after = table(changing)
    assert outcome["mode"] == "new frames only"
    new = after[~after["frame_id"].isin(before["frame_id"])]
    joined = new[new["group"].isin(before["group"])]
    assert len(joined), "the copy's frames join the groups of the first clip's"
    replaced = after[after["replaced_by"].notna()]
    assert 0 < len(replaced) == outcome["replaced"], "a better duplicate replaced a kept frame"
    by_id = after.set_index("frame_id")
    kept_before = set(before.loc[before["kept"], "frame_id"])
    for row in replaced.itertuples():
        replacement = by_id.loc[row.replaced_by]
        assert row.frame_id in kept_before and not row.kept
        assert replacement["kept"] and replacement["group"] == row.group
        assert replacement["pos_max"] > row.pos_max
    for group, members in joined.groupby("group"):
        earlier = before[(before["group"] == group) & before["kept"]].iloc[0]
        kept_now = after[(after["group"] == group) & after["kept"]]
        assert len(kept_now) == 1
        if members["pos_max"].max() > earlier["pos_max"]:
            assert kept_now["frame_id"].iloc[0] in set(members["frame_id"])
        else:
            assert kept_now["frame_id"].iloc[0] == earlier["frame_id"]
    # The index still holds the replaced frames (they stand for their groups) and the new kept.
    assert set(index(changing).frame_ids()) == set(
        after.loc[after["kept"] | after["replaced_by"].notna(), "frame_id"]
    )

    # The dataset's new version holds the replacement, not the frame it replaced.
    def frames(rows: pd.DataFrame) -> set[tuple[str, int]]:
        return set(zip(rows["video_id"], rows["frame_index"], strict=True))

    in_dataset = frames(changing.manifest())
    assert frames(replaced).isdisjoint(in_dataset)
    assert frames(by_id.loc[replaced["replaced_by"]]) <= in_dataset


def test_the_keys_added_later_leave_fingerprints_as_they_were_until_set(tmp_path):
    """dedup.replace, dedup.replace_margin and dedup.colour_overlap were added later: at their
    defaults no project's work turns stale; set, they make dedup and what follows it run again,
    not the filter."""
    from dataminer_dagster.config import parse_project_config

    raw = {
        "name": "p",
        "output_dir": str(tmp_path),
        "inputs": {"urls": ["http://127.0.0.1/a.mp4"]},
        "filter": {"positive_prompts": ["a"]},
    }
    before = parse_project_config(raw).fingerprints()
    defaults = {"replace": "never", "replace_margin": 0.02, "colour_overlap": None}
    assert parse_project_config(raw | {"dedup": defaults}).fingerprints() == before
    with pytest.raises(ValueError, match="colour_overlap"):  # a share of pixels: 0 to 1
        parse_project_config(raw | {"dedup": {"colour_overlap": 1.5}})
    for setting in ({"replace": "better"}, {"replace_margin": 0.05}, {"colour_overlap": 0.8}):
        after = parse_project_config(raw | {"dedup": setting}).fingerprints()
        assert {stage for stage in before if before[stage] != after[stage]} == {
            "dedup",
            "detect",
            "dataset",
        }


# A clip's scene k has background PALETTE[k] and shapes in the colours after it; the project's
# clips cut once, at 1 s (scenes 0 and 1), the clip added later at 0.5, 1 and 1.5 s (scenes 0-3).
LATER_CUTS = (0.5, 1.0, 1.5)


def colours_in_a_group(project) -> int:
    """How many groups hold frames of two scenes (two colour schemes)."""
    frames = table(project)
    cuts = frames["video_id"].str.startswith("later").map({True: LATER_CUTS, False: (1.0,)})
    scene = [sum(t >= c for c in at) for t, at in zip(frames["timestamp"], cuts, strict=True)]
    grouped = frames.assign(scene=scene)[frames["group"] >= 0]
    return int((grouped.groupby("group")["scene"].nunique() > 1).sum())


def kept_frames_check(project):
    """The latest result of dedup's `no_duplicates_kept` check."""
    events = [
        event
        for run in project.instance.get_runs()
        for event in project.instance.all_logs(
            run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
        )
        if event.dagster_event.event_specific_data.check_name == "no_duplicates_kept"
    ]
    assert events
    return max(events, key=lambda event: event.timestamp).dagster_event.event_specific_data


def test_with_the_colour_check_frames_the_embedding_joins_stay_apart_when_their_colours_do(
    changing, tmp_path
):
    """dedup.colour_overlap in a real project. The random-weight embedder finds every frame alike
    at a low threshold; with the colour check no group holds frames of two colour schemes, after a
    full dedup (where the kept frames' check counts no pair of them) and after a video added later
    brings two schemes no kept frame has, whose frames the kept index's colours keep apart."""
    changing.register(dedup={"threshold": 0.2})
    changing.run()
    assert colours_in_a_group(changing) > 0  # the embedding alone joins the scenes

    changing.register(dedup={"colour_overlap": 0.8})
    changing.run()
    assert dedup_outcome(changing)["mode"] == "every frame"
    assert colours_in_a_group(changing) == 0
    assert table(changing)["kept"].sum() >= 2  # a frame of each scene
    # The kept frames of the two scenes are alike to the embedding, but no duplicates.
    check = kept_frames_check(changing)
    assert check.passed and check.metadata["pairs_above_threshold"].value == 0
    kept_index = index(changing)
    assert kept_index.colours().shape == (kept_index.size, BINS**3)

    later = write_videos(
        tmp_path / "later",
        {"later.mp4": SyntheticVideoSpec(width=96, height=64, fps=10, scene_cuts=LATER_CUTS)},
    )
    changing.register(inputs={"files": [*changing.clips[:2], str(later["later.mp4"])]})
    changing.run()
    assert dedup_outcome(changing)["mode"] == "new frames only"
    assert colours_in_a_group(changing) == 0
    after = table(changing)
    new = after[after["video_id"].str.startswith("later")]
    assert (~new["kept"]).any()  # its first two scenes joined kept frames
    assert new.loc[new["timestamp"] >= 1.0, "kept"].any()  # its new schemes have kept frames
    assert index(changing).colours().shape == (int(after["kept"].sum()), BINS**3)
