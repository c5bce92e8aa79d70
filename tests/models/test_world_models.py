"""The models trained on the synthetic world, shipped in the package, loaded as hub weights are.

The SigLIP directory goes through the filter stage's `SiglipScorer` and the YOLO checkpoint
through `load_detector`, the code that loads a hub checkpoint or a user's `.pt` file; a few
frames of the held-out world (the seed the training scripts measure on, which no training world
uses) must be scored and boxed as their truth says.
"""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest

from dataminer_dagster.core.coco import box_iou
from dataminer_dagster.core.world import plan_world
from dataminer_dagster.core.world_render import COLOURS, SHAPES
from dataminer_dagster.core.world_truth import JUNK_CAPTIONS, FrameTruth
from dataminer_dagster.models.detectors import load_detector
from dataminer_dagster.models.siglip import SiglipScorer
from dataminer_dagster.models.world_models import WORLD_SIGLIP, WORLD_YOLO

HELD_OUT_SEED = 900  # EVAL_WORLD_SEED of scripts/train_world_*.py
OBJECT_PROMPTS = [f"a {colour} {shape}" for colour in COLOURS for shape in SHAPES]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def held_out() -> list[tuple[np.ndarray, FrameTruth]]:
    """Every 5th frame (BGR) of the held-out world with its truth."""
    return [
        video.render(index)
        for video in plan_world(HELD_OUT_SEED).videos
        for index in range(0, video.frame_count, 5)
    ]


def _plain(truth: FrameTruth, *, objects: int) -> bool:
    """A content frame of `objects` objects, each whole and not small."""
    return (
        not truth.junk
        and len(truth.objects) == objects
        and all(o.visible >= 0.9 and o.area >= 600 for o in truth.objects)
    )


def _pick(frames, wanted, count: int) -> list[tuple[np.ndarray, FrameTruth]]:
    """The first `count` frames that `wanted` accepts, each of a different caption."""
    picked, seen = [], set()
    for image, truth in frames:
        key = tuple(o.label for o in truth.objects) + (truth.junk,)
        if wanted(truth) and key not in seen:
            picked.append((image, truth))
            seen.add(key)
    assert len(picked) >= count, "the held-out world has too few such frames"
    return picked[:count]


def test_shipped_models_carry_their_training_figures():
    for folder in (WORLD_SIGLIP, WORLD_YOLO.parent):
        figures = json.loads((folder / "training.json").read_text())
        assert figures["eval_world_seed"] == HELD_OUT_SEED
        assert figures["command"].startswith("python scripts/train_world_")
    assert (WORLD_SIGLIP / "model.safetensors").stat().st_size < 8_000_000
    assert WORLD_YOLO.stat().st_size < 8_000_000


def test_world_siglip_knows_the_junk_and_the_colours(held_out, tmp_path):
    """Junk frames score their junk prompt and no object; a frame of one object scores no junk
    prompt, and its best object prompt names the object's colour (a colour-order slip in the
    preprocessing would name another). Which shape, the shipped model often confuses (a star for
    a triangle): training.json has its figures."""
    singles = _pick(held_out, lambda t: _plain(t, objects=1), 4)
    junk = _pick(held_out, lambda t: t.junk == "black", 1)
    junk += _pick(held_out, lambda t: t.junk == "text", 1)
    paths = []
    for number, (image, _) in enumerate(singles + junk):
        paths.append(tmp_path / f"{number}.jpg")
        cv2.imwrite(str(paths[-1]), image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    prompts = [*OBJECT_PROMPTS, *JUNK_CAPTIONS.values()]
    scorer = SiglipScorer(WORLD_SIGLIP, device="cpu")
    result = scorer.embed_all(paths)
    assert list(result.indices) == list(range(len(paths)))
    scores = scorer.score(result.embeddings, scorer.embed_texts(prompts))
    objects = len(OBJECT_PROMPTS)

    for row, (_, truth) in enumerate(singles):
        best = OBJECT_PROMPTS[int(scores[row, :objects].argmax())]
        assert best.split()[1] == truth.objects[0].colour, (truth.objects[0], best)
        assert scores[row, objects:].max() < 0.5, (truth.objects[0], scores[row].round(2))
    for row, (_, truth) in enumerate(junk, start=len(singles)):
        assert scores[row, prompts.index(JUNK_CAPTIONS[truth.junk])] >= 0.5, truth.junk
        assert scores[row, :objects].max() < 0.5, (truth.junk, scores[row].round(2))


def test_world_yolo_boxes_the_shapes(held_out):
    frames = _pick(held_out, lambda t: _plain(t, objects=2), 3)
    frames += _pick(held_out, lambda t: _plain(t, objects=1), 4)
    black = _pick(held_out, lambda t: t.junk == "black", 1)
    detector = load_detector("yolo", str(WORLD_YOLO), confidence=0.2, device="cpu")
    assert detector.labels == list(SHAPES)
    found = detector.detect([cv2.cvtColor(image, cv2.COLOR_BGR2RGB) for image, _ in frames + black])

    for (_, truth), detections in zip(frames, found, strict=False):
        for obj in truth.objects:
            on_it = [d for d in detections if box_iou((d.x, d.y, d.w, d.h), obj.box) >= 0.6]
            assert on_it, (obj, detections)
            assert max(on_it, key=lambda d: d.score).label == obj.shape, (obj, detections)
    assert found[-1] == []
