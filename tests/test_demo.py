"""The README's main command: `dataminer demo` finishes offline and quietly, and mines the
synthetic world with the models trained on it. Its dataset is checked against the world's truth:
the kept frames show the prompted objects and no junk scene, the objects are boxed, the planted
near-duplicates are joined and kept in one split, the three splits are filled, and the YOLO
data.yaml is valid.

One demo runs for the module, as a user runs it: the installed `dataminer` command in a process of
its own, with a home that has never run Dagster or Ultralytics (their first-run notices would
show), and without DAGSTER_HOME."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa
import yaml

from dataminer_dagster.assets.dataset.dataset_splits import SPLITS
from dataminer_dagster.cli.running import QUIET_LIBRARIES
from dataminer_dagster.core.coco import box_iou, validate_coco
from dataminer_dagster.core.world import WrittenWorld, load_world
from dataminer_dagster.core.world_render import SHAPES
from dataminer_dagster.core.world_truth import FrameTruth, ObjectTruth, VideoTruth
from dataminer_dagster.db.schema import videos
from dataminer_dagster.demo import PROMPTED_COLOURS
from dataminer_dagster.testing import environment_for

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("demo")]

BIN = Path(sys.executable).parent
# The lines the demo prints: its own, the progress and the outcome. Any other is noise.
OWN_LINE = re.compile(r"(demo: |progress: |project demo: |note: |  |\d+ runs )")
# A detector box is on an object when it has the object's class and this overlap with its truth.
MIN_IOU = 0.5


@dataclass(frozen=True)
class DemoRun:
    code: int
    output: str  # stdout and stderr, interleaved
    project: Path  # the project's output folder
    world: WrittenWorld
    urls: dict[str, str]  # video id -> URL, from the catalog
    same_as: dict[str, str | None]  # video id -> the video it is a copy of, from the catalog

    @property
    def dataset(self) -> Path:
        return self.project / "dataset"

    def truth(self, video_id: str) -> VideoTruth:
        return self.world.truth_for(self.urls[video_id])

    def frame(self, video_id: str, timestamp: float) -> FrameTruth:
        return self.truth(video_id).at(timestamp)


@pytest.fixture(scope="module")
def demo(pg_server, tmp_path_factory) -> DemoRun:
    root = tmp_path_factory.mktemp("demo")
    user_home = root / "user"  # never ran Dagster or Ultralytics
    user_home.mkdir()
    leave_out = {"DAGSTER_HOME", "YOLO_CONFIG_DIR", *QUIET_LIBRARIES}
    with pg_server.database() as url:
        home = root / "home"
        env = {k: v for k, v in os.environ.items() if k not in leave_out}
        env.update(environment_for(url, home), HOME=str(user_home))
        result = subprocess.run(
            [str(BIN / "dataminer"), "demo", "--port", "0", "--no-progress"],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=600,
        )
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    sa.select(videos.c.video_id, videos.c.url, videos.c.same_as)
                ).all()
        finally:
            engine.dispose()
    return DemoRun(
        code=result.returncode,
        output=result.stdout,
        project=home / "data" / "projects" / "demo",
        world=load_world(home / "demo" / "www"),
        urls={row.video_id: row.url for row in rows},
        same_as={row.video_id: row.same_as for row in rows},
    )


@pytest.fixture(scope="module")
def manifest(demo) -> pd.DataFrame:
    assert demo.code == 0, demo.output
    return pd.read_parquet(demo.dataset / "manifest.parquet")


@pytest.fixture(scope="module")
def passed(demo) -> pd.DataFrame:
    """Every frame the filter passed, with its dedup group, its truth and its source clip."""
    assert demo.code == 0, demo.output
    frames = pd.read_parquet(demo.project / "dedup" / "frames.parquet")
    truths = [
        demo.frame(v, t) for v, t in zip(frames["video_id"], frames["timestamp"], strict=True)
    ]
    frames["truth_group"] = [truth.group for truth in truths]
    frames["junk"] = [truth.junk for truth in truths]
    frames["source"] = [demo.truth(v).source for v in frames["video_id"]]
    return frames


def prompted(obj: ObjectTruth) -> bool:
    return obj.colour in PROMPTED_COLOURS


def clear(obj: ObjectTruth) -> bool:
    """Seen well enough that a detector ought to box it."""
    return obj.visible >= 0.5


def test_the_demo_completes_with_nothing_but_its_own_lines(demo):
    assert demo.code == 0, demo.output
    assert "project demo: complete" in demo.output
    assert "WARNING" not in demo.output
    noise = [line for line in demo.output.splitlines() if line and not OWN_LINE.match(line)]
    assert not noise, "lines of the libraries reached the terminal:\n" + "\n".join(noise)
    assert re.search(r"train \d+, val [1-9]\d*, test [1-9]\d* images; [1-9]\d* boxes", demo.output)


def test_the_kept_frames_show_the_prompted_objects_and_no_junk(demo, manifest, passed):
    assert manifest["source_url"].str.startswith("http://127.0.0.1:").all(), "through yt-dlp"
    assert not passed["junk"].any(), passed.loc[passed["junk"].notna(), "frame_id"].tolist()
    for row in manifest.itertuples():
        truth = demo.frame(row.video_id, row.timestamp)
        assert truth.kind == "content", (row.file_name, truth)
        assert any(prompted(obj) for obj in truth.objects), (row.file_name, truth.objects)
    # and the filter found the scenes that show a prompted object clearly: most have an image
    wanted = {
        frame.group
        for truth in demo.world.truths.values()
        for frame in truth.frames
        if frame.kind == "content" and any(prompted(o) and clear(o) for o in frame.objects)
    }
    found = {demo.frame(r.video_id, r.timestamp).group for r in manifest.itertuples()}
    assert len(found & wanted) >= 0.8 * len(wanted), (sorted(found), sorted(wanted))


def test_the_objects_are_boxed(demo, manifest):
    coco = json.loads((demo.dataset / "annotations.coco.json").read_text())
    validate_coco(coco)
    assert [c["name"] for c in sorted(coco["categories"], key=lambda c: c["id"])] == list(SHAPES)
    names = {c["id"]: c["name"] for c in coco["categories"]}
    boxes = defaultdict(list)
    file_of = {image["id"]: image["file_name"] for image in coco["images"]}
    for a in coco["annotations"]:
        boxes[file_of[a["image_id"]]].append((names[a["category_id"]], a["bbox"]))
    assert set(file_of.values()) == set(manifest["file_name"])

    on_objects = prompted_objects = prompted_boxed = 0
    for row in manifest.itertuples():
        objects = demo.frame(row.video_id, row.timestamp).objects
        for shape, box in boxes[row.file_name]:
            on_objects += any(o.shape == shape and box_iou(box, o.box) >= MIN_IOU for o in objects)
        for obj in filter(clear, filter(prompted, objects)):
            prompted_objects += 1
            prompted_boxed += any(
                shape == obj.shape and box_iou(box, obj.box) >= MIN_IOU
                for shape, box in boxes[row.file_name]
            )
    total = sum(len(b) for b in boxes.values())
    assert prompted_boxed >= 0.9 * prompted_objects, (prompted_boxed, prompted_objects)
    assert on_objects >= 0.75 * total, (on_objects, total)


def test_the_planted_duplicates_are_joined_and_kept_in_one_split(demo, manifest, passed):
    # a copy behind a second URL is the same video: one of the two is the other's copy
    alias = next(path for path in demo.world.truths if "/" in path)
    original = demo.world.truths[alias].video
    ids = {
        path: v for v, url in demo.urls.items() for path in (alias, original) if url.endswith(path)
    }
    assert set(demo.same_as[v] for v in ids.values()) - {None} <= set(ids.values()), ids
    assert sum(demo.same_as[v] is not None for v in ids.values()) == 1, demo.same_as
    # each re-encoded, resized, cropped, mirrored, overlaid or sped-up copy shares a dedup group
    # with its source clip; no group joins two clips
    videos_of_source = passed.groupby("source")["video_id"].agg(set)
    joined = passed.groupby("group")["video_id"].agg(set)
    for source, members in videos_of_source.items():
        if len(members) > 1:
            assert any(len(m) > 1 and m <= members for m in joined), (source, members)
    assert (passed.groupby("group")["source"].nunique() == 1).all()
    # so a source clip's videos, and any scene's images, are in one split
    split_of = dict(zip(manifest["video_id"], manifest["split"], strict=True))
    for members in videos_of_source.values:
        assert len({split_of[v] for v in members if v in split_of}) <= 1, members
    groups = Counter(
        (demo.frame(r.video_id, r.timestamp).group, r.split) for r in manifest.itertuples()
    )
    assert len({group for group, _ in groups}) == len(groups)


def test_the_three_splits_are_filled_and_the_yolo_data_yaml_is_valid(demo, manifest):
    counts = manifest["split"].value_counts()
    assert all(counts.get(split, 0) > 0 for split in SPLITS), counts.to_dict()
    yolo = demo.dataset / "yolo"
    assert not (yolo / "NO_DATA_YAML.txt").exists()
    data = yaml.safe_load((yolo / "data.yaml").read_text())
    assert list(data["names"].values()) == list(SHAPES)
    for split in SPLITS:
        images = Path(data["path"]) / data[split]
        labels = yolo / "labels" / split
        assert len(list(images.iterdir())) == counts[split]
        assert {p.stem for p in labels.iterdir()} == {p.stem for p in images.iterdir()}
    for split in SPLITS:
        coco = json.loads((demo.dataset / "coco" / f"{split}.json").read_text())
        assert len(coco["images"]) == counts[split]
    assert (
        len((demo.dataset / "hf" / "train" / "metadata.jsonl").read_text().splitlines())
        == counts["train"]
    )
