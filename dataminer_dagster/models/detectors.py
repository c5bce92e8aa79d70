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

Frames are processed in batches of `batch_size`, grouped by frame size so that a frame gets the
same result whatever else is in its batch. torch, transformers and ultralytics are imported only
when a detector is loaded.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from dataminer_dagster.models.loading import (
    ModelUnavailableError,
    load_once,
    load_pretrained,
    resolve_device,
)

if TYPE_CHECKING:
    import torch

DetectorKind = Literal["yolo", "owlv2", "grounding_dino"]
DETECTOR_KINDS: tuple[DetectorKind, ...] = ("yolo", "owlv2", "grounding_dino")
OPEN_VOCABULARY_KINDS = ("owlv2", "grounding_dino")
# Open-vocabulary detectors predict one box per query (OWLv2: per image patch, Grounding DINO: per
# decoder query) and do no suppression of their own, so one object comes back several times. Boxes
# of the same category overlapping more than this are merged into the best one.
OPEN_VOCABULARY_NMS_IOU = 0.5


@dataclass(frozen=True)
class Detection:
    """One detected object: box in pixels (top-left corner + size, as COCO), score, category."""

    x: float
    y: float
    w: float
    h: float
    score: float
    label: str


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
    batch_size: int = 8,
) -> Detector:
    """Load a detector by kind and model name or path.

    `classes` (yolo only) keeps the named classes of the model; `prompts` (owlv2, grounding_dino,
    required) are the text queries, each one a category. Detections scoring below `confidence` are
    dropped. `device` is "auto" (CUDA when available), "cpu", "cuda" or "cuda:N"; on CUDA the
    models run in half precision.
    """
    if kind not in DETECTOR_KINDS:
        raise ValueError(f"Unknown detector kind {kind!r}; choose one of {list(DETECTOR_KINDS)}")
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    resolved = str(resolve_device(device))
    if kind == "yolo":
        if prompts is not None:
            raise ValueError(
                "Detector 'yolo' has a fixed class list and takes `classes`, not `prompts`; "
                f"use one of {list(OPEN_VOCABULARY_KINDS)} to detect from text prompts"
            )
        if classes is not None:
            _check_names(classes, "classes")
        return UltralyticsDetector(model, classes, confidence, resolved, batch_size)
    if classes is not None:
        raise ValueError(f"Detector {kind!r} is open-vocabulary and takes `prompts`, not `classes`")
    if prompts is None:
        raise ValueError(f"Detector {kind!r} needs `prompts`: the text of each thing to detect")
    _check_names(prompts, "prompts")
    if kind == "owlv2":
        return Owlv2Detector(model, prompts, confidence, resolved, batch_size)
    return GroundingDinoDetector(model, prompts, confidence, resolved, batch_size)


class UltralyticsDetector:
    """An ultralytics YOLO checkpoint, optionally restricted to some of its classes."""

    def __init__(
        self,
        model: str,
        classes: Sequence[str] | None,
        confidence: float,
        device: str,
        batch_size: int,
    ):
        YOLO = _ultralytics_loading_safely()  # noqa: N806 (the library's class)
        try:
            self.model = load_once(("yolo", model), lambda: YOLO(model))
        except TypeError as exc:  # ultralytics' answer to a checkpoint it may not unpickle
            raise ModelUnavailableError(
                f"YOLO model {model!r} was not loaded: {exc}. Checkpoints are loaded with "
                "torch.load(weights_only=True) and ultralytics' list of known model classes, "
                "because a .pt file can run any code when it is unpickled in full. If you trust "
                f"this file, set {SAFE_LOAD_VARIABLE}=0 in the environment of the runs."
            ) from exc
        except OSError as exc:  # FileNotFoundError for a missing path, ConnectionError offline
            raise ModelUnavailableError(
                f"YOLO model {model!r} could not be loaded: {exc}. Give the path of a local .pt "
                "checkpoint or model yaml, or download the weights on a machine with internet access "
                "(e.g. `yolo predict model=yolo11n.pt`) and copy the file here."
            ) from exc
        if self.model.task != "detect":
            raise ValueError(
                f"YOLO model {model!r} is a {self.model.task!r} model, not an object detector"
            )
        names: dict[int, str] = dict(self.model.names)
        if classes is None:
            self.class_ids = None
            self.labels = [names[i] for i in sorted(names)]
        else:
            ids = {name: i for i, name in names.items()}
            unknown = [c for c in classes if c not in ids]
            if unknown:
                raise ValueError(_unknown_classes_message(model, unknown, list(names.values())))
            self.class_ids = [ids[c] for c in classes]
            self.labels = list(classes)
        self.names = names
        self.confidence = confidence
        self.device = device
        self.batch_size = batch_size
        # ultralytics 8.4 replaced `half=True` by `quantize=16` (and warns on `half`).
        self.precision = {"quantize": 16} if device.startswith("cuda") else {}

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        images = _check_images(images)
        results: list[list[Detection]] = [[] for _ in images]
        for batch in _batches(images, self.batch_size):
            bgr = [np.ascontiguousarray(images[i][:, :, ::-1]) for i in batch]  # ultralytics' order
            predictions = self.model.predict(
                bgr,
                conf=self.confidence,
                classes=self.class_ids,
                device=self.device,
                verbose=False,
                **self.precision,
            )
            for i, prediction in zip(batch, predictions, strict=True):
                boxes = prediction.boxes
                labels = [self.names[int(c)] for c in boxes.cls.tolist()]
                results[i] = _to_detections(
                    boxes.xyxy, boxes.conf, labels, images[i].shape, self.confidence
                )
        return results


SAFE_LOAD_VARIABLE = "ULTRALYTICS_SAFE_LOAD"


def _ultralytics_loading_safely() -> type:
    """ultralytics' YOLO class, with its restricted checkpoint loading switched on (unless the
    user switched it off with ULTRALYTICS_SAFE_LOAD=0). By default ultralytics unpickles a
    checkpoint in full, and pip-installs a module that the checkpoint names and that is missing:
    a .pt file from elsewhere could run any code."""
    os.environ.setdefault(SAFE_LOAD_VARIABLE, "1")
    from ultralytics import YOLO
    from ultralytics.nn import tasks

    wanted = os.environ[SAFE_LOAD_VARIABLE].strip().lower() not in ("0", "false", "no", "off")
    if wanted and not getattr(getattr(tasks, "_SafeLoad", None), "SUPPORTED", False):
        raise ModelUnavailableError(
            "this ultralytics or torch cannot load checkpoints safely (ultralytics >= 8.4.190 and "
            f"torch >= 2.6 can); upgrade them, or set {SAFE_LOAD_VARIABLE}=0 to trust every "
            "checkpoint"
        )
    tasks.SAFE_LOAD = wanted  # read at each load; set here too when ultralytics came in earlier
    return YOLO


class Owlv2Detector:
    """transformers OWLv2: every text prompt is a query; a box gets the prompt it matches best."""

    def __init__(
        self, model: str, prompts: Sequence[str], confidence: float, device: str, batch_size: int
    ):
        from transformers import Owlv2ForObjectDetection, Owlv2Processor

        loaded = load_pretrained(
            model,
            device=device,
            model_class=Owlv2ForObjectDetection,
            processor_class=Owlv2Processor,
        )
        self.processor, self.model, self.dtype = loaded.processor, loaded.model, loaded.dtype
        tokenizer = self.processor.tokenizer
        lengths = [len(ids) for ids in tokenizer(list(prompts))["input_ids"]]
        too_long = [
            p for p, n in zip(prompts, lengths, strict=True) if n > tokenizer.model_max_length
        ]
        if too_long:
            raise ValueError(
                f"OWLv2 prompts {too_long} are longer than the {tokenizer.model_max_length} tokens "
                f"that model {model!r} reads; shorten them"
            )
        self.labels = list(prompts)
        self.confidence = confidence
        self.device = device
        self.batch_size = batch_size

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        import torch

        images = _check_images(images)
        results: list[list[Detection]] = [[] for _ in images]
        for batch in _batches(images, self.batch_size):
            frames = [images[i] for i in batch]
            inputs = self.processor(
                text=[self.labels] * len(frames),
                images=frames,
                input_data_format="channels_last",  # never guessed, even for 3-pixel-wide frames
                return_tensors="pt",
            )
            with torch.inference_mode():
                outputs = self.model(**_to_device(inputs, self.device, self.dtype))
            # Post-process in float32 on the CPU: fp16 pixel coordinates lose up to 2 px at 4K.
            outputs.logits = outputs.logits.float().cpu()
            outputs.pred_boxes = outputs.pred_boxes.float().cpu()
            sizes = [frame.shape[:2] for frame in frames]
            # OWLv2 pads each frame to a square; with (height, width) target sizes the processor
            # scales boxes back to the frame's pixels.
            processed = self.processor.post_process_grounded_object_detection(
                outputs=outputs, threshold=self.confidence, target_sizes=sizes
            )
            for i, found in zip(batch, processed, strict=True):
                boxes, scores, label_ids = _nms(found["boxes"], found["scores"], found["labels"])
                labels = [self.labels[int(k)] for k in label_ids.tolist()]
                results[i] = _to_detections(boxes, scores, labels, images[i].shape, self.confidence)
        return results


class GroundingDinoDetector:
    """transformers Grounding DINO with the prompts joined into one caption ("cat. red car.").

    The model scores every caption token for every box. A prompt's score for a box is the best
    score over the prompt's own tokens, and the box takes the prompt with the highest score. This
    replaces the processor's decoding of token spans into text, which returns fragments or
    merged prompts ("red car cat") rather than the categories that were asked for.
    """

    def __init__(
        self, model: str, prompts: Sequence[str], confidence: float, device: str, batch_size: int
    ):
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        for prompt in prompts:
            if "." in prompt:
                raise ValueError(
                    f"Grounding DINO prompt {prompt!r} contains '.', which separates prompts in its caption"
                )
        loaded = load_pretrained(
            model,
            device=device,
            model_class=AutoModelForZeroShotObjectDetection,
            processor_class=AutoProcessor,
        )
        self.processor, self.model, self.dtype = loaded.processor, loaded.model, loaded.dtype
        self.labels = list(prompts)
        self.confidence = confidence
        self.device = device
        self.batch_size = batch_size
        self.text_inputs, self.token_prompt = self._encode_caption(model)

    def _encode_caption(self, model: str) -> tuple[dict[str, Any], torch.Tensor]:
        """Tokenize the caption once; map each token to the index of its prompt (-1: none)."""
        import torch

        spans, caption = [], ""
        for prompt in self.labels:
            spans.append((len(caption), len(caption) + len(prompt)))
            caption += prompt + ". "
        caption = caption.rstrip()
        encoded = self.processor.tokenizer(
            caption, return_offsets_mapping=True, return_tensors="pt"
        )
        offsets = encoded.pop("offset_mapping")[0].tolist()
        max_tokens = self.model.config.max_text_len
        if encoded["input_ids"].shape[1] > max_tokens:
            raise ValueError(
                f"The {len(self.labels)} prompts make a caption of {encoded['input_ids'].shape[1]} tokens; "
                f"Grounding DINO model {model!r} reads at most {max_tokens}. Use fewer or shorter prompts."
            )
        token_prompt = torch.full((len(offsets),), -1, dtype=torch.long)
        for t, (start, end) in enumerate(offsets):
            for p, (span_start, span_end) in enumerate(spans):
                if end > start and start >= span_start and end <= span_end:
                    token_prompt[t] = p
        missing = [self.labels[p] for p in range(len(self.labels)) if not (token_prompt == p).any()]
        if missing:
            raise ValueError(f"Grounding DINO's tokenizer produced no tokens for prompts {missing}")
        return dict(encoded), token_prompt

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        import torch

        images = _check_images(images)
        results: list[list[Detection]] = [[] for _ in images]
        n_prompts = len(self.labels)
        for batch in _batches(images, self.batch_size):
            frames = [images[i] for i in batch]
            inputs = dict(
                self.processor.image_processor(
                    images=frames, input_data_format="channels_last", return_tensors="pt"
                )
            )
            inputs.update({k: v.expand(len(frames), -1) for k, v in self.text_inputs.items()})
            with torch.inference_mode():
                outputs = self.model(**_to_device(inputs, self.device, self.dtype))
            probs = outputs.logits.float().sigmoid().cpu()  # (frames, queries, max_text_len)
            tokens = self.token_prompt
            probs = probs[:, :, : len(tokens)]
            # Best token score per prompt: (frames, queries, prompts).
            per_prompt = torch.stack(
                [probs[:, :, tokens == p].amax(dim=-1) for p in range(n_prompts)], dim=-1
            )
            scores, label_ids = per_prompt.max(dim=-1)
            boxes = _cxcywh_to_xyxy(outputs.pred_boxes.float().cpu())
            for row, (i, frame) in enumerate(zip(batch, frames, strict=True)):
                height, width = frame.shape[:2]
                keep = scores[row] >= self.confidence
                scaled = boxes[row][keep] * torch.tensor([width, height, width, height])
                kept_boxes, kept_scores, kept_ids = _nms(
                    scaled, scores[row][keep], label_ids[row][keep]
                )
                labels = [self.labels[int(k)] for k in kept_ids.tolist()]
                results[i] = _to_detections(
                    kept_boxes, kept_scores, labels, frame.shape, self.confidence
                )
        return results


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


def _unknown_classes_message(model: str, unknown: list[str], valid: list[str]) -> str:
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, valid, n=1) or [
            n for n in valid if n.lower() == name.lower()
        ]
        if close:
            hints.append(f"{name!r} -> did you mean {close[0]!r}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return (
        f"Unknown class(es) {unknown} for YOLO model {model!r}{hint}. "
        f"The model's {len(valid)} classes are: {', '.join(valid)}"
    )


def _check_images(images: Sequence[np.ndarray]) -> list[np.ndarray]:
    checked = []
    for i, image in enumerate(images):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3 or 0 in image.shape:
            raise ValueError(
                f"images[{i}] must be an RGB uint8 array of shape (height, width, 3), "
                f"got dtype {image.dtype} and shape {image.shape}"
            )
        checked.append(image)
    return checked


def _batches(images: Sequence[np.ndarray], batch_size: int) -> Iterator[list[int]]:
    """Indices of `images` in batches of at most `batch_size`, each batch of one frame size.

    Frames of different sizes in one batch are padded to a common size, which changes the result;
    grouping by size keeps every frame's detections independent of its batch neighbours.
    """
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        groups[image.shape].append(i)
    for indices in groups.values():
        for start in range(0, len(indices), batch_size):
            yield indices[start : start + batch_size]


def _to_device(inputs: Any, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """Move tensors to `device`; floating ones (pixel values) also to the model's dtype."""
    moved = {}
    for key, value in dict(inputs).items():
        if hasattr(value, "to"):
            value = value.to(device, dtype=dtype) if value.is_floating_point() else value.to(device)
        moved[key] = value
    return moved


def _cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    import torch

    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def _nms(
    boxes: torch.Tensor, scores: torch.Tensor, label_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-category non-maximum suppression (see OPEN_VOCABULARY_NMS_IOU); best score first."""
    import torch
    from torchvision.ops import batched_nms

    boxes, scores = boxes.float().cpu(), scores.float().cpu()
    label_ids = torch.as_tensor(label_ids, dtype=torch.long).cpu()
    keep = batched_nms(boxes, scores, label_ids, OPEN_VOCABULARY_NMS_IOU)
    return boxes[keep], scores[keep], label_ids[keep]


def _to_detections(
    xyxy: Any, scores: Any, labels: Sequence[str], shape: tuple[int, ...], confidence: float
) -> list[Detection]:
    """Detections clipped to the image, without empty boxes, best score first."""
    height, width = shape[:2]
    boxes = np.asarray(
        xyxy.float().cpu() if hasattr(xyxy, "cpu") else xyxy, dtype=np.float64
    ).reshape(-1, 4)
    values = np.asarray(
        scores.float().cpu() if hasattr(scores, "cpu") else scores, dtype=np.float64
    )
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, width)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, height)
    detections = [
        Detection(float(x0), float(y0), float(x1 - x0), float(y1 - y0), float(score), label)
        for (x0, y0, x1, y1), score, label in zip(boxes, values, labels, strict=True)
        if x1 > x0 and y1 > y0 and score >= confidence
    ]
    detections.sort(key=lambda d: -d.score)
    return detections
