"""`redo: true` (the lane's config in the Launchpad) does a stage's done work again, and what
follows it runs again where its input was made again: frames extracted again are filtered
again, and a project stage done again makes the project's later stages run again, each in turn.
"""

from __future__ import annotations

import shutil

import pytest

from dataminer_dagster.partitions import PARTITIONS
from dataminer_dagster.registry import PROJECTS, VIDEOS
from tests.helpers.pipeline import materialize_partitions
from tests.helpers.project_runs import redone
from tests.helpers.stages import STAGES

pytestmark = pytest.mark.slow


def test_frames_extracted_again_are_filtered_again_and_the_project_follows(changing):
    done = changing.run()
    video_id = next(key for stage, key in done if stage == "frames")
    ((frames_dir, _),) = changing.catalog.frames.profiles([video_id])[video_id].values()
    shutil.rmtree(frames_dir)  # lost by hand: a redo of the partition extracts it again

    materialize_partitions(
        [STAGES["frames"]],
        [video_id],
        instance=changing.instance,
        resources=changing.resources,
        partitions=PARTITIONS[VIDEOS],
        redo=True,
    )
    assert frames_dir.is_dir()
    assert redone(done, changing.run()) == {
        "frames": 1,
        "filter": 1,
        "dedup": 1,
        "detect": 1,
        "dataset": 1,
    }


def test_a_project_stage_done_again_makes_the_later_stages_run_again(changing):
    done = changing.run()
    materialize_partitions(
        [STAGES["dedup"]],
        ["changing"],
        instance=changing.instance,
        resources=changing.resources,
        partitions=PARTITIONS[PROJECTS],
        redo=True,
    )
    assert changing.catalog.projects.get("changing").stage == "detect"
    assert redone(done, changing.run()) == {"dedup": 1, "detect": 1, "dataset": 1}


def test_frames_with_nothing_to_extract_again_redo_nothing_after_them(changing):
    done = changing.run()
    video_id = next(key for stage, key in done if stage == "frames")
    materialize_partitions(
        [STAGES["frames"]],
        [video_id],
        instance=changing.instance,
        resources=changing.resources,
        partitions=PARTITIONS[VIDEOS],
        redo=True,
    )
    assert redone(done, changing.run()) == {"frames": 1}
