"""Object detectors behind one small interface.

`load_detector(kind, model, ...)` returns a `Detector`: give it RGB uint8 frames, get back, per
frame, `Detection`s with COCO-style pixel boxes (top-left corner and size), a score and a category
name. Kinds:

* ``yolo``: an ultralytics checkpoint (``yolo11n.pt``, a fine-tuned ``best.pt``) or a model yaml
  (random weights, for experiments). `classes` keeps only the named classes.
* ``owlv2``: transformers OWLv2 (``google/owlv2-base-patch16-ensemble`` or a local directory),
  open vocabulary: one category per text prompt.
* ``grounding_dino``: transformers Grounding DINO (``IDEA-Research/grounding-dino-tiny`` or a
  local directory), open vocabulary from text prompts.

What to detect always comes from the caller (the project config): there are no default classes or
prompts. YOLO-World and YOLOE are not offered for prompts: ultralytics encodes prompts with a CLIP
or MobileCLIP text model that it downloads at `set_classes` time, so they cannot run offline. A
YOLO-World/YOLOE checkpoint whose classes were set and saved beforehand is a fixed-class model and
loads as ``yolo``.

Each kind is a `batched_detector.BatchedDetector`: `yolo_detector.UltralyticsDetector`,
`open_vocabulary_detectors.Owlv2Detector` and `open_vocabulary_detectors.GroundingDinoDetector`.
torch, transformers and ultralytics are imported only when a detector is loaded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.models.device import DevicePlan
from dataminer_dagster.models.loading import resolve_device, resolve_dtype
from dataminer_dagster.models.open_vocabulary_detectors import (
    GroundingDinoDetector,
    Owlv2Detector,
)
from dataminer_dagster.models.yolo_detector import UltralyticsDetector

DetectorKind = Literal["yolo", "owlv2", "grounding_dino"]
DETECTOR_KINDS: tuple[DetectorKind, ...] = ("yolo", "owlv2", "grounding_dino")
OPEN_VOCABULARY_KINDS = ("owlv2", "grounding_dino")


class Detector(Protocol):
    labels: list[str]  # the category names it can emit (its classes or prompts), in config order

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Detections for each RGB uint8 HxWx3 image, best score first."""
        ...


def load_detector(
    kind: DetectorKind,
    model: str,
    *,
    classes: Sequence[str] | None = None,
    prompts: Sequence[str] | None = None,
    confidence: float,
    device: str = "auto",
    batch_size: int | None = None,
    dtype: str | None = None,
) -> Detector:
    """Load a detector by kind and model name or path.

    `classes` (yolo only) keeps the named classes of the model; `prompts` (owlv2, grounding_dino,
    required) are the text queries, each one a category. Detections scoring below `confidence` are
    dropped. `device` is "auto" (CUDA when available), "cpu", "cuda" or "cuda:N". `batch_size` is
    the most frames per model call; None means 8 on the CPU and, on CUDA, as many as fit in half
    the free device memory up to 32. On CUDA a batch never takes more than that memory, whatever
    `batch_size` says. `dtype` None means float16 on a GPU with tensor cores, float32 elsewhere
    (`models.device.compute_dtype`); YOLO runs in float16 or float32 only.
    """
    if kind not in DETECTOR_KINDS:
        raise ValueError(f"Unknown detector kind {kind!r}; choose one of {list(DETECTOR_KINDS)}")
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    resolved = resolve_device(device)
    plan = DevicePlan.for_device(resolved, resolve_dtype(dtype, resolved))
    if kind == "yolo":
        if prompts is not None:
            raise ValueError(
                "Detector 'yolo' has a fixed class list and takes `classes`, not `prompts`; "
                f"use one of {list(OPEN_VOCABULARY_KINDS)} to detect from text prompts"
            )
        if classes is not None:
            _check_names(classes, "classes")
        return UltralyticsDetector(model, classes, confidence, plan, batch_size)
    if classes is not None:
        raise ValueError(f"Detector {kind!r} is open-vocabulary and takes `prompts`, not `classes`")
    if prompts is None:
        raise ValueError(f"Detector {kind!r} needs `prompts`: the text of each thing to detect")
    _check_names(prompts, "prompts")
    if kind == "owlv2":
        return Owlv2Detector(model, prompts, confidence, plan, batch_size)
    return GroundingDinoDetector(model, prompts, confidence, plan, batch_size)


def _check_names(names: Sequence[str], what: str) -> None:
    if isinstance(names, str):
        raise ValueError(f"`{what}` must be a list of strings, got the single string {names!r}")
    if not names:
        raise ValueError(f"`{what}` is empty: list what to detect")
    blank = [n for n in names if not isinstance(n, str) or not n.strip()]
    if blank:
        raise ValueError(f"`{what}` must be non-empty strings, got {blank}")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"`{what}` lists {repeated} more than once")
