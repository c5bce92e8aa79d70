"""Detectors: tiny random-weight models of the real architectures, loaded from disk like real ones."""

from collections import Counter

import numpy as np
import pytest

from dataminer_dagster.core.coco import ImageDetections, build_coco, read_coco, write_coco
from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames
from dataminer_dagster.models.detectors import Detection, load_detector
from dataminer_dagster.models.loading import ModelUnavailableError
from dataminer_dagster.models.tiny_detectors import (
    build_tiny_detectors,
    build_tiny_grounding_dino,
    coco_class_names,
)

# tests/conftest.py sets YOLO_OFFLINE and HF_HUB_OFFLINE before anything imports ultralytics or
# transformers: no DNS probe, no download attempts.

PROMPTS = ["a red car", "dog", "person on a bike"]
CONFIDENCE = 0.3


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    return build_tiny_detectors(tmp_path_factory.mktemp("tiny-detectors"))


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """Five RGB frames: four 160x120 and one 96x128, so a batch mixes sizes."""
    small = SyntheticVideoSpec(width=160, height=120, seconds=4 / 30, seed=3)
    tall = SyntheticVideoSpec(width=96, height=128, seconds=1 / 30, seed=4)
    bgr = (
        list(synthetic_frames(small))[:2]
        + list(synthetic_frames(tall))
        + list(synthetic_frames(small))[2:4]
    )
    return [np.ascontiguousarray(f[:, :, ::-1]) for f in bgr]


def options(kind: str) -> dict:
    return {"prompts": PROMPTS} if kind != "yolo" else {}


def assert_well_formed(results, images, labels, confidence):
    assert len(results) == len(images)
    for detections, image in zip(results, images, strict=True):
        height, width = image.shape[:2]
        assert [d.score for d in detections] == sorted((d.score for d in detections), reverse=True)
        for d in detections:
            assert isinstance(d, Detection)
            assert d.label in labels
            assert confidence <= d.score <= 1.0
            assert d.x >= 0 and d.y >= 0 and d.w > 0 and d.h > 0
            assert d.x + d.w <= width + 1e-3 and d.y + d.h <= height + 1e-3


@pytest.mark.parametrize("kind", ["yolo", "owlv2", "grounding_dino"])
def test_detections_are_pixel_boxes_inside_the_image(kind, tiny_models, frames):
    detector = load_detector(
        kind, str(tiny_models[kind]), confidence=CONFIDENCE, device="cpu", **options(kind)
    )
    results = detector.detect(frames)

    expected_labels = coco_class_names() if kind == "yolo" else PROMPTS
    assert detector.labels == expected_labels
    assert_well_formed(results, frames, expected_labels, CONFIDENCE)
    assert sum(len(r) for r in results) > 0, (
        "the tiny model should detect something on synthetic frames"
    )
    assert detector.detect([]) == []


@pytest.mark.parametrize("kind", ["yolo", "owlv2", "grounding_dino"])
def test_batching_does_not_change_results(kind, tiny_models, frames):
    path = str(tiny_models[kind])
    batched = load_detector(
        kind, path, confidence=CONFIDENCE, batch_size=3, **options(kind)
    ).detect(frames)
    single = load_detector(kind, path, confidence=CONFIDENCE, batch_size=1, **options(kind))
    one_by_one = [single.detect([f])[0] for f in frames]

    for a, b in zip(batched, one_by_one, strict=True):
        assert [d.label for d in a] == [d.label for d in b]
        np.testing.assert_allclose([d.score for d in a], [d.score for d in b], atol=1e-4)
        np.testing.assert_allclose(
            [(d.x, d.y, d.w, d.h) for d in a], [(d.x, d.y, d.w, d.h) for d in b], atol=1e-2
        )


def test_yolo_class_filter_by_name(tiny_models, frames):
    path = str(tiny_models["yolo"])
    everything = load_detector("yolo", path, confidence=CONFIDENCE).detect(frames)
    seen = Counter(d.label for r in everything for d in r)
    assert len(seen) >= 2, "need detections of several classes to filter"
    wanted = [seen.most_common(1)[0][0], "person"]

    detector = load_detector("yolo", path, classes=wanted, confidence=CONFIDENCE)
    filtered = detector.detect(frames)

    assert detector.labels == wanted
    assert_well_formed(filtered, frames, wanted, CONFIDENCE)
    for kept, every in zip(filtered, everything, strict=True):
        assert kept == [d for d in every if d.label in wanted]
    assert 0 < sum(len(r) for r in filtered) < sum(len(r) for r in everything)


def test_higher_confidence_keeps_a_subset(tiny_models, frames):
    path = str(tiny_models["owlv2"])
    low = load_detector("owlv2", path, prompts=PROMPTS, confidence=0.1).detect(frames)
    high = load_detector("owlv2", path, prompts=PROMPTS, confidence=0.6).detect(frames)
    for strict, loose in zip(high, low, strict=True):
        assert all(d.score >= 0.6 for d in strict)
        assert len(strict) <= len(loose)


def test_unknown_yolo_class_lists_the_valid_names(tiny_models):
    with pytest.raises(ValueError) as err:
        load_detector(
            "yolo", str(tiny_models["yolo"]), classes=["cars", "person", "unicorn"], confidence=0.5
        )
    message = str(err.value)
    assert "Unknown class(es) ['cars', 'unicorn']" in message
    assert "did you mean 'car'?" in message
    assert "The model's 80 classes are: person, bicycle, car," in message


@pytest.mark.parametrize(
    "kind, kwargs, message",
    [
        ("yolo", {"prompts": ["dog"]}, "takes `classes`, not `prompts`"),
        ("owlv2", {"classes": ["dog"]}, "takes `prompts`, not `classes`"),
        ("owlv2", {}, "needs `prompts`"),
        ("owlv2", {"prompts": []}, "`prompts` is empty"),
        ("owlv2", {"prompts": "dog"}, "single string 'dog'"),
        ("owlv2", {"prompts": ["dog", " "]}, "non-empty strings"),
        ("grounding_dino", {"prompts": ["dog", "dog"]}, "lists ['dog'] more than once"),
        ("yolo_world", {}, "Unknown detector kind 'yolo_world'"),
        ("yolo", {"confidence": 1.5}, "confidence must be between 0 and 1"),
        ("yolo", {"batch_size": 0}, "batch_size must be at least 1"),
        ("yolo", {"device": "tpu"}, "device 'tpu' is not one of"),
    ],
)
def test_configuration_errors(kind, kwargs, message, tiny_models):
    kwargs = {"confidence": 0.5, **kwargs}
    with pytest.raises(ValueError) as err:
        load_detector(kind, str(tiny_models.get(kind, "unused")), **kwargs)
    assert message in str(err.value)


def test_grounding_dino_rejects_prompts_with_the_separator(tiny_models):
    with pytest.raises(ValueError, match="contains '.'"):
        load_detector(
            "grounding_dino",
            str(tiny_models["grounding_dino"]),
            prompts=["a car. a dog"],
            confidence=0.5,
        )


def test_owlv2_rejects_prompts_longer_than_its_text_context(tiny_models):
    with pytest.raises(ValueError, match="longer than the 64 tokens"):
        load_detector("owlv2", str(tiny_models["owlv2"]), prompts=["dog", "x" * 80], confidence=0.5)


def test_bad_images_are_rejected(tiny_models):
    detector = load_detector("owlv2", str(tiny_models["owlv2"]), prompts=PROMPTS, confidence=0.5)
    with pytest.raises(ValueError, match=r"images\[1\] must be an RGB uint8 array"):
        detector.detect([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8)])
    with pytest.raises(ValueError, match="got dtype float32"):
        detector.detect([np.zeros((8, 8, 3), np.float32)])


@pytest.mark.parametrize(
    "kind, model, message",
    [
        ("yolo", "{tmp}/missing.pt", "could not be loaded"),
        ("yolo", "yolo-no-such-model.pt", "could not be loaded"),
        ("owlv2", "{tmp}/missing-owlv2", "does not exist"),
        ("grounding_dino", "no-such-org/no-such-model", "hf download no-such-org/no-such-model"),
    ],
)
def test_missing_models_give_one_actionable_error(kind, model, message, tmp_path):
    with pytest.raises(ModelUnavailableError) as err:
        load_detector(kind, model.format(tmp=tmp_path), confidence=0.5, **options(kind))
    assert message in str(err.value)


def test_tiny_models_are_deterministic(tmp_path):
    import torch
    from transformers import AutoModelForZeroShotObjectDetection

    first = build_tiny_grounding_dino(tmp_path / "a", seed=7)
    second = build_tiny_grounding_dino(tmp_path / "b", seed=7)
    other = build_tiny_grounding_dino(tmp_path / "c", seed=8)
    weights = [
        AutoModelForZeroShotObjectDetection.from_pretrained(p).state_dict()
        for p in (first, second, other)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])


def test_detections_make_valid_coco(tiny_models, frames, tmp_path):
    from pycocotools.coco import COCO

    detector = load_detector(
        "owlv2", str(tiny_models["owlv2"]), prompts=PROMPTS, confidence=CONFIDENCE
    )
    results = detector.detect(frames)
    images = [
        ImageDetections(f"frames/f_{i:06d}.jpg", f.shape[1], f.shape[0], dets)
        for i, (f, dets) in enumerate(zip(frames, results, strict=True))
    ]
    path = write_coco(build_coco(images, detector.labels), tmp_path / "annotations.json")

    doc = read_coco(path)
    assert len(doc["annotations"]) == sum(len(r) for r in results)
    assert [c["name"] for c in doc["categories"]] == PROMPTS
    assert len(COCO(str(path)).getAnnIds()) == len(doc["annotations"])


def test_a_yolo_world_checkpoint_with_saved_classes_loads_as_yolo(tmp_path):
    """YOLO-World cannot encode new prompts offline, but a checkpoint whose classes were set (and
    their text embeddings stored) on a connected machine is a fixed-class detector."""
    import torch
    import ultralytics
    from ultralytics.nn.tasks import WorldModel, yaml_model_load

    names = ["red car", "dog"]
    config = yaml_model_load("yolov8s-worldv2.yaml")
    config["scales"] = {"s": [0.33, 0.0625, 64]}
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = WorldModel(config, nc=len(names), verbose=False)
        text_embeddings = torch.randn(1, len(names), model.txt_feats.shape[-1])
    model.txt_feats = torch.nn.functional.normalize(text_embeddings, dim=-1)
    model.names = dict(enumerate(names))
    path = tmp_path / "tiny-yolov8s-worldv2-custom.pt"
    torch.save(
        {"model": model.half(), "train_args": {"imgsz": 128}, "version": ultralytics.__version__},
        path,
    )

    detector = load_detector("yolo", str(path), classes=["dog"], confidence=0.0)
    results = detector.detect([np.zeros((120, 160, 3), np.uint8)])
    assert detector.labels == ["dog"]
    assert_well_formed(results, [np.zeros((120, 160, 3), np.uint8)], ["dog"], 0.0)


class _RunsACommand:
    """What a hostile checkpoint can carry: unpickling it calls os.system."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


def test_a_checkpoint_that_would_run_code_is_refused_unless_trusted(
    tiny_models, tmp_path, monkeypatch
):
    import torch

    marker = tmp_path / "ran"
    checkpoint = torch.load(tiny_models["yolo"], weights_only=False)
    checkpoint["docs"] = _RunsACommand(f"touch {marker}")
    hostile = tmp_path / "hostile.pt"
    torch.save(checkpoint, hostile)

    with pytest.raises(ModelUnavailableError, match="ULTRALYTICS_SAFE_LOAD=0"):
        load_detector("yolo", str(hostile), confidence=0.3)
    assert not marker.exists()
    detector = load_detector("yolo", str(tiny_models["yolo"]), confidence=0.3)
    assert detector.labels == coco_class_names()  # a plain checkpoint loads as before

    monkeypatch.setenv("ULTRALYTICS_SAFE_LOAD", "0")  # the user trusts this file
    load_detector("yolo", str(hostile), confidence=0.3)
    assert marker.exists()
