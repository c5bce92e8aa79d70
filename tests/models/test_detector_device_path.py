"""The detectors' device path (frames staged, preprocessed and post-processed on the model's
device) against the libraries' own CPU paths, on the CPU, with tiny random-weight models.

On CUDA the path differs in where the tensors live, the precision, page-locked staging and the
prefetch thread's stream. The CUDA choices are injected here as a `DevicePlan` that prefetches
and sizes batches from memory figures, so the same code runs; only CUDA's memory figures are a
stand-in (see test_device.py).
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataminer_dagster.core.synthetic import SyntheticVideoSpec, synthetic_frames
from dataminer_dagster.models.batched_detector import AUTO_BATCH_LIMIT, DEFAULT_BATCH_SIZE
from dataminer_dagster.models.detection_boxes import to_detections
from dataminer_dagster.models.detectors import Detection, load_detector
from dataminer_dagster.models.device import DevicePlan
from dataminer_dagster.models.open_vocabulary_detectors import (
    _nms,
    _preprocess_on_device,
    _runs_on_tensors,
)
from dataminer_dagster.models.tiny_detectors import build_tiny_detectors
from dataminer_dagster.models.yolo_detector import Letterbox, UltralyticsDetector
from tests.models.cuda_stand_ins import StandInMemory

PROMPTS = ["a red car", "dog", "person on a bike"]
CONFIDENCE = 0.2
# The tiny YOLO's input side is 128: frames of 128x96 need no resize, only padding.
UNRESIZED = (96, 128)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    return build_tiny_detectors(tmp_path_factory.mktemp("tiny-detectors"))


def video_frames(width: int, height: int, seed: int, count: int = 2) -> list[np.ndarray]:
    spec = SyntheticVideoSpec(width=width, height=height, seconds=count / 30, seed=seed)
    return [np.ascontiguousarray(f[:, :, ::-1]) for f in synthetic_frames(spec)][:count]


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    """Frames YOLO resizes up and down (160x120, 333x211, 1280x720) and one it only pads."""
    return (
        video_frames(160, 120, 3)
        + video_frames(*UNRESIZED[::-1], 4)
        + video_frames(333, 211, 7)
        + video_frames(1280, 720, 6, count=1)
    )


def cpu_plan(**changes) -> DevicePlan:
    return dataclasses.replace(DevicePlan.for_device(torch.device("cpu"), torch.float32), **changes)


def assert_same(got: list[list[Detection]], expected: list[list[Detection]], *, score, box):
    assert [len(f) for f in got] == [len(f) for f in expected]
    for ours, theirs in zip(got, expected, strict=True):
        assert [d.label for d in ours] == [d.label for d in theirs]
        np.testing.assert_allclose([d.score for d in ours], [d.score for d in theirs], atol=score)
        np.testing.assert_allclose(
            [(d.x, d.y, d.w, d.h) for d in ours], [(d.x, d.y, d.w, d.h) for d in theirs], atol=box
        )


# ---------------------------------------------------------------------------------------- YOLO


@settings(max_examples=200, deadline=None)
@given(
    height=st.integers(1, 2000),
    width=st.integers(1, 2000),
    imgsz=st.sampled_from([(640, 640), (128, 128), (384, 640), (736, 1280)]),
    stride=st.sampled_from([32, 64]),
    rect=st.booleans(),
)
def test_letterbox_geometry_is_ultralytics(height, width, imgsz, stride, rect):
    from ultralytics.data.augment import LetterBox

    expected = LetterBox(imgsz, auto=rect, stride=stride).get_params(
        {"img": np.zeros((height, width, 3), np.uint8)}
    )
    got = Letterbox.of((height, width), imgsz, stride, rect=rect)
    assert (got.width, got.height) == tuple(expected["new_unpad"])
    assert (got.top, got.bottom, got.left, got.right) == (
        expected["top"],
        expected["bottom"],
        expected["left"],
        expected["right"],
    )


@pytest.mark.parametrize(
    ("height", "width"), [UNRESIZED, (120, 160), (211, 333), (720, 1280), (40, 30)]
)
def test_letterbox_pixels_match_ultralytics(height, width):
    from ultralytics.data.augment import LetterBox

    frame = video_frames(width, height, seed=width)[0]
    expected = LetterBox((128, 128), auto=True, stride=32)(image=frame[:, :, ::-1])[:, :, ::-1]
    box = Letterbox.of((height, width), (128, 128), 32, rect=True)
    pixels = box(torch.from_numpy(frame).permute(2, 0, 1)[None], torch.float32)
    levels = pixels[0].permute(1, 2, 0).numpy() * 255
    np.testing.assert_allclose(levels, levels.round(), atol=1e-3)  # whole uint8 levels, as cv2's
    got = levels.round().astype(np.int16)
    assert got.shape == expected.shape
    difference = np.abs(got - expected.astype(np.int16))
    if (height, width) == UNRESIZED:
        assert difference.max() == 0  # padding only: exact
    else:  # cv2 resizes in fixed point: at most one level, on a minority of the pixels
        assert difference.max() <= 1 and (difference > 0).mean() < 0.25


def yolo_predict(detector: UltralyticsDetector, frames: list[np.ndarray]) -> list[list[Detection]]:
    """The library's own path, as the detector took it before: predict on BGR frames."""
    results = []
    for frame in frames:
        boxes = detector.model.predict(
            np.ascontiguousarray(frame[:, :, ::-1]),
            conf=detector.confidence,
            classes=detector.class_ids,
            device="cpu",
            verbose=False,
        )[0].boxes
        labels = [detector.names[int(c)] for c in boxes.cls.tolist()]
        results.append(to_detections(boxes.xyxy, boxes.conf, labels, frame.shape, CONFIDENCE))
    return results


def test_yolo_detects_as_ultralytics_predict(tiny_models, frames):
    detector = load_detector("yolo", str(tiny_models["yolo"]), confidence=CONFIDENCE)
    got, expected = detector.detect(frames), yolo_predict(detector, frames)

    assert sum(map(len, expected)) > 20, "the comparison needs detections"
    padded_only = [i for i, f in enumerate(frames) if f.shape[:2] == UNRESIZED]
    assert_same(
        [got[i] for i in padded_only],
        [expected[i] for i in padded_only],
        score=1e-5,
        box=1e-3,
    )
    # a resized pixel may differ by one level from cv2's: the random network's scores move a
    # little, the same boxes come out
    assert_same(got, expected, score=0.05, box=1.0)


def test_yolo_class_filter_is_applied_in_the_suppression(tiny_models, frames):
    everything = load_detector("yolo", str(tiny_models["yolo"]), confidence=CONFIDENCE)
    found = {d.label for f in everything.detect(frames) for d in f}
    wanted = sorted(found)[:2]
    detector = load_detector(
        "yolo", str(tiny_models["yolo"]), classes=wanted, confidence=CONFIDENCE
    )
    got = detector.detect(frames)
    assert {d.label for f in got for d in f} == set(wanted)
    assert_same(got, yolo_predict(detector, frames), score=0.05, box=1.0)


def test_yolo_refuses_bfloat16(tiny_models):
    with pytest.raises(ValueError, match="float16 or float32, not bfloat16"):
        load_detector("yolo", str(tiny_models["yolo"]), confidence=0.5, dtype="bfloat16")


# ------------------------------------------------------------------------------- transformers


def owlv2_reference(detector, frames: list[np.ndarray]) -> list[list[Detection]]:
    """The processor's own path on numpy frames on the CPU, as the detector took it before."""
    results = []
    for frame in frames:
        inputs = detector.processor(
            text=[PROMPTS],
            images=[frame],
            input_data_format="channels_last",
            return_tensors="pt",
        )
        with torch.inference_mode():
            outputs = detector.model(**inputs)
        found = detector.processor.post_process_grounded_object_detection(
            outputs=outputs, threshold=CONFIDENCE, target_sizes=[frame.shape[:2]]
        )[0]
        boxes, scores, ids = _nms(found["boxes"], found["scores"], found["labels"])
        labels = [PROMPTS[int(k)] for k in ids.tolist()]
        results.append(to_detections(boxes, scores, labels, frame.shape, CONFIDENCE))
    return results


def test_owlv2_detects_as_its_processor(tiny_models, frames):
    detector = load_detector(
        "owlv2", str(tiny_models["owlv2"]), prompts=PROMPTS, confidence=CONFIDENCE
    )
    expected = owlv2_reference(detector, frames)
    assert sum(map(len, expected)) > 20
    assert_same(detector.detect(frames), expected, score=1e-5, box=1e-3)
    # the prompts' tokens, made once, are what the processor makes for every frame
    text = detector.processor(text=[PROMPTS] * 3, return_tensors="pt")
    for key, value in detector.text_inputs.items():
        torch.testing.assert_close(value.repeat(3, 1), text[key], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["owlv2", "grounding_dino"])
def test_image_processor_on_device_tensors_equals_it_on_numpy(kind, tiny_models, frames):
    detector = load_detector(
        kind, str(tiny_models[kind]), prompts=PROMPTS, confidence=CONFIDENCE, device="cpu"
    )
    processor = detector.processor.image_processor
    for size in {f.shape for f in frames}:
        same_size = [f for f in frames if f.shape == size]
        got = _preprocess_on_device(processor, same_size, detector.plan)
        expected = processor(
            images=same_size, input_data_format="channels_last", return_tensors="pt"
        )
        assert set(got) == set(expected)
        for key in got:
            torch.testing.assert_close(got[key], expected[key], rtol=0, atol=1e-6)


def test_only_torchvision_processors_run_on_device_tensors():
    from transformers import Owlv2ImageProcessor, Owlv2ImageProcessorPil

    assert _runs_on_tensors(Owlv2ImageProcessor())
    assert not _runs_on_tensors(Owlv2ImageProcessorPil())  # numpy and PIL: the CPU only


# ---------------------------------------------------------------------- the CUDA plan, on a CPU


@pytest.mark.parametrize("kind", ["yolo", "owlv2", "grounding_dino"])
def test_cuda_plan_batches_from_memory_and_prefetches_with_the_same_results(
    kind, tiny_models, frames
):
    options = {} if kind == "yolo" else {"prompts": PROMPTS}
    path = str(tiny_models[kind])
    plain = load_detector(kind, path, confidence=CONFIDENCE, device="cpu", **options)
    assert plain.batch_limit == DEFAULT_BATCH_SIZE and plain.plan.prefetch_batches == 0

    # as on a GPU with room for 3 frames in half its free memory, batches prepared ahead
    memory = StandInMemory(free=6_000_000, per_item=1_000_000)
    plan = cpu_plan(prefetch_batches=2, memory=memory)
    classes_or_prompts = options.get("prompts")
    as_on_cuda = type(plain)(path, classes_or_prompts, CONFIDENCE, plan, None)
    assert as_on_cuda.batch_limit == AUTO_BATCH_LIMIT

    expected = plain.detect(frames)
    got = as_on_cuda.detect(frames)
    sizes = {f.shape for f in frames}
    assert {as_on_cuda.batch_size(s) for s in sizes} == {3}
    assert len(memory.measured) == len(sizes)  # measured once per frame size
    assert_same(got, expected, score=1e-5, box=1e-3)
    assert as_on_cuda.detect(frames) == got  # the sizes are kept: no new measurement
    assert len(memory.measured) == len(sizes)


def test_a_batch_of_many_frames_of_one_size_keeps_its_order(tiny_models):
    many = video_frames(160, 120, seed=11, count=7)
    plan = cpu_plan(prefetch_batches=2, memory=StandInMemory(free=4_000, per_item=1_000))
    detector = UltralyticsDetector(str(tiny_models["yolo"]), None, CONFIDENCE, plan, 5)
    assert detector.batch_size(many[0].shape) == 2  # half of 4,000 bytes at 1,000 a frame
    one_by_one = [detector.detect([frame])[0] for frame in many]
    assert_same(detector.detect(many), one_by_one, score=1e-5, box=1e-3)


def test_one_prefetch_thread_serves_every_call(tiny_models):
    # Each prefetch thread prepares on its own CUDA stream: one thread for the detector's life
    # keeps its cached device memory on one stream, however many chunks it is given.
    plan = cpu_plan(prefetch_batches=2)
    detector = UltralyticsDetector(str(tiny_models["yolo"]), None, CONFIDENCE, plan, 1)
    prepared_on = []
    prepare = detector.prepare

    def recording(frames):
        prepared_on.append(threading.current_thread())
        return prepare(frames)

    detector.prepare = recording
    for seed in (1, 2):
        detector.detect(video_frames(160, 120, seed=seed))
    assert len(prepared_on) == 4 and len(set(prepared_on)) == 1
    assert prepared_on[0] is not threading.current_thread()


def matched_share(found: list[list[Detection]], reference: list[list[Detection]]) -> float:
    """The share of the reference boxes on which `found` has a box of the same frame at IoU 0.9."""
    from torchvision.ops import box_convert, box_iou

    def corners(detections: list[Detection]) -> torch.Tensor:
        boxes = torch.tensor([(d.x, d.y, d.w, d.h) for d in detections], dtype=torch.float64)
        return box_convert(boxes.reshape(-1, 4), "xywh", "xyxy")

    matched = [
        (box_iou(corners(theirs), corners(ours)) >= 0.9).any(dim=1)
        for ours, theirs in zip(found, reference, strict=True)
    ]
    return torch.cat(matched).double().mean().item()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["owlv2", "grounding_dino"])
def test_half_precision_finds_the_float32_boxes(kind, dtype, tiny_models, frames):
    # Borderline boxes may go either way, and labels are not compared: the random tiny Grounding
    # DINO picks its 20 queries by rank among near-tied proposals, and near-tied prompt scores
    # flip a box's label (bfloat16 here: one frame with 19 boxes instead of 20, 94% of the boxes
    # found, over a quarter of those under another prompt).
    def detect(precision: str) -> list[list[Detection]]:
        path = str(tiny_models[kind])
        options = {"prompts": PROMPTS, "confidence": CONFIDENCE, "device": "cpu"}
        return load_detector(kind, path, dtype=precision, **options).detect(frames)

    expected, got = detect("float32"), detect(dtype)
    assert sum(map(len, expected)) > 20, "the comparison needs detections"
    for ours, theirs in zip(got, expected, strict=True):
        assert abs(len(ours) - len(theirs)) <= 1
    assert matched_share(got, expected) >= 0.9
    assert matched_share(expected, got) >= 0.9


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    frames=st.integers(1, 5),
    agnostic=st.booleans(),
    classes=st.sampled_from([None, [0], [1, 3]]),
    max_det=st.sampled_from([3, 300]),
)
def test_batched_suppression_keeps_what_ultralytics_keeps_frame_by_frame(
    seed, frames, agnostic, classes, max_det
):
    """`suppress` (all frames at once) against ultralytics' `non_max_suppression` (frame by frame)
    on raw network outputs with many overlapping boxes of several classes: the same rows, in the
    same order, per frame."""
    from ultralytics.utils.nms import non_max_suppression

    from dataminer_dagster.models.yolo_detector import _YoloNetwork, suppress

    generator = torch.Generator().manual_seed(seed)
    boxes, classes_count = 300, 4
    centres = torch.rand((frames, 2, boxes), generator=generator) * 200
    sizes = 20 + torch.rand((frames, 2, boxes), generator=generator) * 60
    scores = torch.rand((frames, classes_count, boxes), generator=generator)
    prediction = torch.cat((centres, sizes, scores), 1)
    network = _YoloNetwork(
        backend=None,
        imgsz=(256, 256),
        stride=32,
        rect=True,
        dtype=torch.float32,
        iou=0.5,
        max_det=max_det,
        agnostic=agnostic,
        end2end=False,
    )
    rows, counts = suppress(prediction, 0.3, classes, network)
    theirs = non_max_suppression(
        prediction, 0.3, 0.5, classes, agnostic, max_det=max_det, nc=classes_count
    )
    assert counts == [len(frame) for frame in theirs]
    assert sum(counts) > 0
    for ours, their in zip(rows.split(counts), theirs, strict=True):
        assert torch.equal(ours, their[:, :6].float())
