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

Frames are processed in batches grouped by frame size, so that a frame gets the same result
whatever else is in its batch. Each batch is stacked once (into page-locked memory on CUDA), copied
to the device as uint8 and preprocessed there: YOLO's letterbox as tensor ops (`Letterbox`), the
transformers detectors' own torchvision image processors on device tensors. The network, the
suppression of overlapping boxes and their scaling to the frame run on the device too; one copy
per batch brings the boxes back. On CUDA a thread prepares the next batches on a stream of its own
while the model runs, and a batch holds as many frames as fit in half the free device memory, up
to `batch_size` (`models.device`). torch, transformers and ultralytics are imported only when a
detector is loaded.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.models.device import (
    DevicePlan,
    PrefetchThreads,
    finish_stream,
    plan_batch_size,
    prepared_ahead,
    to_device,
)
from dataminer_dagster.models.loading import (
    ModelLoadError,
    ModelUnavailableError,
    load_once,
    load_pretrained,
    resolve_device,
    resolve_dtype,
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
# Frames per model call when no batch size is configured: on the CPU, and on CUDA the most that a
# batch sized from the free memory takes (the batch of YOLO's H200 measurement, bench/gpu.md).
DEFAULT_BATCH_SIZE = 8
AUTO_BATCH_LIMIT = 32


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


class BatchedDetector:
    """What every detector shares: frames grouped by size, a batch size per frame size from the
    device plan, and the next batches prepared while the model runs one.

    A detector implements `prepare` (same-size frames to the model's input on the device) and
    `run` (that input to detections, per frame).
    """

    labels: list[str]

    def __init__(self, plan: DevicePlan, batch_size: int | None):
        self.plan = plan
        self.batch_limit = batch_size or (AUTO_BATCH_LIMIT if plan.memory else DEFAULT_BATCH_SIZE)
        self._batch_sizes: dict[tuple[int, ...], int] = {}
        self._prefetch = PrefetchThreads(1, "batch-prefetch")

    def prepare(self, frames: Sequence[np.ndarray]) -> Any:
        raise NotImplementedError

    def run(self, prepared: Any) -> list[list[Detection]]:
        raise NotImplementedError

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        images = _check_images(images)
        results: list[list[Detection]] = [[] for _ in images]
        for shape, indices in _by_size(images).items():
            size = self.batch_size(shape)
            batches = [indices[start : start + size] for start in range(0, len(indices), size)]
            for batch, prepared in prepared_ahead(
                batches, lambda b: self.prepare([images[i] for i in b]), self.plan, self._prefetch
            ):
                for i, found in zip(batch, self.run(prepared), strict=True):
                    results[i] = found
                # The batch was prepared on the prefetch thread's stream, which reuses its memory
                # once it is dropped: the model's stream must be done with it first.
                finish_stream(self.plan.device)
        return results

    def batch_size(self, shape: tuple[int, ...]) -> int:
        """Frames of `shape` per batch: the limit, or on CUDA what fits of it in the free memory,
        measured once per frame size on blank frames."""
        if shape not in self._batch_sizes:
            blank = np.zeros(shape, np.uint8)
            self._batch_sizes[shape] = plan_batch_size(
                self.plan, self.batch_limit, lambda n: self.run(self.prepare([blank] * n))
            )
        return self._batch_sizes[shape]


@dataclass(frozen=True)
class Letterbox:
    """ultralytics' LetterBox for one frame size, as tensor ops on the frames' device.

    Resize keeping the aspect ratio, bilinear as its cv2.INTER_LINEAR and rounded to uint8 levels
    as cv2's output is; pad with grey 114, centred, to the network's size (with `rect`, to the
    next multiple of the stride); scale to 0-1 in the network's precision. cv2 resizes in fixed
    point, so a resized pixel may differ from ultralytics' by one level.
    """

    height: int  # the frame's size once resized
    width: int
    top: int
    bottom: int
    left: int
    right: int

    @classmethod
    def of(
        cls, frame: tuple[int, int], imgsz: tuple[int, int], stride: int, *, rect: bool
    ) -> Letterbox:
        """As LetterBox.get_params: `frame` and `imgsz` are (height, width)."""
        height, width = frame
        ratio = min(imgsz[0] / height, imgsz[1] / width)
        new_width, new_height = max(round(width * ratio), 1), max(round(height * ratio), 1)
        pad_width, pad_height = imgsz[1] - new_width, imgsz[0] - new_height
        if rect:
            pad_width, pad_height = pad_width % stride, pad_height % stride
        half_width, half_height = pad_width / 2, pad_height / 2
        return cls(
            height=new_height,
            width=new_width,
            top=round(half_height - 0.1),
            bottom=round(half_height + 0.1),
            left=round(half_width - 0.1),
            right=round(half_width + 0.1),
        )

    def __call__(self, frames: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(N, 3, H, W) uint8 frames to (N, 3, h, w) network input in `dtype`."""
        import torch

        pixels = frames
        if tuple(frames.shape[-2:]) != (self.height, self.width):
            pixels = torch.nn.functional.interpolate(
                frames.float(), size=(self.height, self.width), mode="bilinear", align_corners=False
            )
            pixels = pixels.add_(0.5).floor_().clamp_(0, 255)  # cv2 rounds to the nearest level
        padding = (self.left, self.right, self.top, self.bottom)
        pixels = torch.nn.functional.pad(pixels, padding, value=114)
        return pixels.to(dtype).div_(255)


@dataclass(frozen=True)
class _YoloNetwork:
    """The network as ultralytics' predictor set it up (fused, on the device, in its precision),
    with the settings of predict's letterbox and suppression."""

    backend: Any  # ultralytics AutoBackend
    imgsz: tuple[int, int]
    stride: int
    rect: bool  # letterbox to the smallest stride multiple, as predict does for PyTorch models
    dtype: torch.dtype
    iou: float
    max_det: int
    agnostic: bool
    end2end: bool


@dataclass(frozen=True)
class _YoloInput:
    pixels: torch.Tensor  # (N, 3, h, w) letterboxed, 0-1, in the network's precision
    frame_shape: tuple[int, int]  # (height, width) of the batch's frames


class UltralyticsDetector(BatchedDetector):
    """An ultralytics YOLO checkpoint, optionally restricted to some of its classes.

    The network, its letterbox size and its suppression settings come from ultralytics' own
    predictor, set up once by a `predict` on a blank frame; the frames then go through `Letterbox`
    on the device, the network, ultralytics' `non_max_suppression` and `scale_boxes`, as in
    `predict`, without its per-frame work on the CPU.
    """

    def __init__(
        self,
        model: str,
        classes: Sequence[str] | None,
        confidence: float,
        plan: DevicePlan,
        batch_size: int | None,
    ):
        import torch

        super().__init__(plan, batch_size)
        if plan.dtype not in (torch.float16, torch.float32):
            raise ValueError(
                f"YOLO models run in float16 or float32, not {str(plan.dtype).removeprefix('torch.')} "
                "(ultralytics has no bfloat16 inference); leave dtype unset or choose one of those"
            )
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
        self.network = self._set_up_network()

    def _set_up_network(self) -> _YoloNetwork:
        import torch

        on_cuda = self.plan.device.type == "cuda"
        # ultralytics 8.4 replaced `half=True` by `quantize=16` (and warns on `half`).
        precision = {"quantize": 16} if on_cuda and self.plan.dtype == torch.float16 else {}
        self.model.predict(
            np.zeros((32, 32, 3), np.uint8),
            conf=self.confidence,
            classes=self.class_ids,
            device=str(self.plan.device),
            verbose=False,
            **precision,
        )
        predictor = self.model.predictor
        backend, args = predictor.model, predictor.args
        model_format = getattr(backend, "format", "pt")
        dynamic = getattr(backend, "dynamic", False)
        return _YoloNetwork(
            backend=backend,
            imgsz=(int(predictor.imgsz[0]), int(predictor.imgsz[1])),
            stride=int(backend.stride),
            rect=bool(args.rect)
            and not predictor.scale_fill
            and (model_format == "pt" or (dynamic and model_format != "imx")),
            dtype=torch.float16 if backend.fp16 else torch.float32,
            iou=float(args.iou),
            max_det=int(args.max_det),
            agnostic=bool(args.agnostic_nms),
            end2end=bool(getattr(backend, "end2end", False)),
        )

    def prepare(self, frames: Sequence[np.ndarray]) -> _YoloInput:
        network = self.network
        height, width = frames[0].shape[:2]
        letterbox = Letterbox.of((height, width), network.imgsz, network.stride, rect=network.rect)
        on_device = to_device(frames, self.plan).permute(0, 3, 1, 2)
        return _YoloInput(letterbox(on_device, network.dtype), (height, width))

    def run(self, prepared: _YoloInput) -> list[list[Detection]]:
        import torch
        from ultralytics.utils.nms import non_max_suppression
        from ultralytics.utils.ops import scale_boxes

        network = self.network
        with torch.inference_mode():
            kept = non_max_suppression(
                network.backend(prepared.pixels),
                self.confidence,
                network.iou,
                self.class_ids,
                network.agnostic,
                max_det=network.max_det,
                nc=0,  # a detection model: every channel after the box is a class
                end2end=network.end2end,
            )
            # float32 before scaling: half-precision pixel coordinates lose up to 2 px at 4K
            kept = [rows[:, :6].float() for rows in kept]
            for rows in kept:
                scale_boxes(prepared.pixels.shape[2:], rows[:, :4], prepared.frame_shape)
            found = _to_host(kept)
        results = []
        for rows in found:
            labels = [self.names[int(c)] for c in rows[:, 5].tolist()]
            results.append(
                _to_detections(
                    rows[:, :4], rows[:, 4], labels, prepared.frame_shape, self.confidence
                )
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


@dataclass(frozen=True)
class _TransformersInput:
    inputs: dict[str, Any]  # the model's keyword arguments, on the device
    sizes: list[tuple[int, int]]  # (height, width) of each frame


def _load_transformers_detector(
    model: str, plan: DevicePlan, model_class: Any, processor_class: Any
) -> Any:
    """The model and its processor, whose image processor must run on device tensors (the
    torchvision backend of transformers 5)."""
    loaded = load_pretrained(
        model,
        device=plan.device,
        dtype=plan.dtype,
        model_class=model_class,
        processor_class=processor_class,
        processor_kwargs={"backend": "torchvision"},
    )
    image_processor = loaded.processor.image_processor
    if not _runs_on_tensors(image_processor):
        raise ModelLoadError(
            f"Model {model!r} came with image processor {type(image_processor).__name__}, which "
            "cannot preprocess on the device; detection needs the torchvision image processors "
            "of transformers 5 (pip install 'transformers>=5')."
        )
    return loaded


def _runs_on_tensors(image_processor: Any) -> bool:
    try:
        from transformers.image_processing_backends import TorchvisionBackend
    except ImportError:  # transformers 4 has no processor backends
        return False
    return isinstance(image_processor, TorchvisionBackend)


def _preprocess_on_device(
    image_processor: Any, frames: Sequence[np.ndarray], plan: DevicePlan
) -> dict[str, Any]:
    """The processor's own resize, pad and normalisation run on the device: the frames are
    copied there once as uint8 and handed to it as tensors, which it keeps where they are."""
    on_device = to_device(frames, plan).permute(0, 3, 1, 2).contiguous()
    return dict(
        image_processor(
            images=list(on_device.unbind(0)),
            input_data_format="channels_first",  # never guessed, even for 3-pixel-wide frames
            return_tensors="pt",
        )
    )


def _model_inputs(
    image_inputs: dict[str, Any], text_inputs: dict[str, Any], frames: int, dtype: torch.dtype
) -> dict[str, Any]:
    """Image inputs (floating ones in the model's dtype) with the text inputs for every frame."""
    inputs = {
        key: value.to(dtype) if value.is_floating_point() else value
        for key, value in image_inputs.items()
    }
    inputs.update({key: value.repeat(frames, 1) for key, value in text_inputs.items()})
    return inputs


class Owlv2Detector(BatchedDetector):
    """transformers OWLv2: every text prompt is a query; a box gets the prompt it matches best."""

    def __init__(
        self,
        model: str,
        prompts: Sequence[str],
        confidence: float,
        plan: DevicePlan,
        batch_size: int | None,
    ):
        from transformers import Owlv2ForObjectDetection, Owlv2Processor

        super().__init__(plan, batch_size)
        loaded = _load_transformers_detector(model, plan, Owlv2ForObjectDetection, Owlv2Processor)
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
        # The prompts' tokens, once: the processor tokenizes them for every frame alike.
        text = self.processor(text=[self.labels], return_tensors="pt")
        self.text_inputs = {
            key: text[key].to(plan.device) for key in ("input_ids", "attention_mask")
        }

    def prepare(self, frames: Sequence[np.ndarray]) -> _TransformersInput:
        images = _preprocess_on_device(self.processor.image_processor, frames, self.plan)
        inputs = _model_inputs(images, self.text_inputs, len(frames), self.dtype)
        return _TransformersInput(inputs, [frame.shape[:2] for frame in frames])

    def run(self, prepared: _TransformersInput) -> list[list[Detection]]:
        import torch

        with torch.inference_mode():
            outputs = self.model(**prepared.inputs)
            # Post-process in float32: fp16 pixel coordinates lose up to 2 px at 4K.
            outputs.logits = outputs.logits.float()
            outputs.pred_boxes = outputs.pred_boxes.float()
            # OWLv2 pads each frame to a square; with (height, width) target sizes the processor
            # scales boxes back to the frame's pixels.
            processed = self.processor.post_process_grounded_object_detection(
                outputs=outputs, threshold=self.confidence, target_sizes=prepared.sizes
            )
            found = _to_host([_nms(f["boxes"], f["scores"], f["labels"]) for f in processed])
        return [
            _to_detections(
                rows[:, :4],
                rows[:, 4],
                [self.labels[int(k)] for k in rows[:, 5].tolist()],
                size,
                self.confidence,
            )
            for rows, size in zip(found, prepared.sizes, strict=True)
        ]


class GroundingDinoDetector(BatchedDetector):
    """transformers Grounding DINO with the prompts joined into one caption ("cat. red car.").

    The model scores every caption token for every box. A prompt's score for a box is the best
    score over the prompt's own tokens, and the box takes the prompt with the highest score. This
    replaces the processor's decoding of token spans into text, which returns fragments or
    merged prompts ("red car cat") rather than the categories that were asked for.
    """

    def __init__(
        self,
        model: str,
        prompts: Sequence[str],
        confidence: float,
        plan: DevicePlan,
        batch_size: int | None,
    ):
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        super().__init__(plan, batch_size)
        for prompt in prompts:
            if "." in prompt:
                raise ValueError(
                    f"Grounding DINO prompt {prompt!r} contains '.', which separates prompts in its caption"
                )
        loaded = _load_transformers_detector(
            model, plan, AutoModelForZeroShotObjectDetection, AutoProcessor
        )
        self.processor, self.model, self.dtype = loaded.processor, loaded.model, loaded.dtype
        self.labels = list(prompts)
        self.confidence = confidence
        text_inputs, token_prompt = self._encode_caption(model)
        self.text_inputs = {key: value.to(plan.device) for key, value in text_inputs.items()}
        self.token_prompt = token_prompt.to(plan.device)

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

    def prepare(self, frames: Sequence[np.ndarray]) -> _TransformersInput:
        images = _preprocess_on_device(self.processor.image_processor, frames, self.plan)
        inputs = _model_inputs(images, self.text_inputs, len(frames), self.dtype)
        return _TransformersInput(inputs, [frame.shape[:2] for frame in frames])

    def run(self, prepared: _TransformersInput) -> list[list[Detection]]:
        import torch

        tokens = self.token_prompt
        with torch.inference_mode():
            outputs = self.model(**prepared.inputs)
            probs = outputs.logits.float().sigmoid()[
                :, :, : len(tokens)
            ]  # (frames, queries, tokens)
            # Best token score per prompt: (frames, queries, prompts).
            per_prompt = torch.stack(
                [probs[:, :, tokens == p].amax(dim=-1) for p in range(len(self.labels))], dim=-1
            )
            scores, label_ids = per_prompt.max(dim=-1)
            boxes = _cxcywh_to_xyxy(outputs.pred_boxes.float())
            kept = []
            for row, (height, width) in enumerate(prepared.sizes):
                keep = scores[row] >= self.confidence
                scale = torch.tensor([width, height, width, height], device=boxes.device)
                kept.append(_nms(boxes[row][keep] * scale, scores[row][keep], label_ids[row][keep]))
            found = _to_host(kept)
        return [
            _to_detections(
                rows[:, :4],
                rows[:, 4],
                [self.labels[int(k)] for k in rows[:, 5].tolist()],
                size,
                self.confidence,
            )
            for rows, size in zip(found, prepared.sizes, strict=True)
        ]


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


def _by_size(images: Sequence[np.ndarray]) -> dict[tuple[int, ...], list[int]]:
    """Indices of `images` by frame size, in input order.

    Frames of different sizes in one batch are padded to a common size, which changes the result;
    batching each size apart keeps every frame's detections independent of its batch neighbours.
    """
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        groups[image.shape].append(i)
    return dict(groups)


def _to_host(per_frame: Sequence[Any], columns: int = 6) -> list[torch.Tensor]:
    """Per-frame detections on the device as float32 (n, columns) tensors on the host, brought
    over in one copy. Each item is an (n, columns) tensor, or a tuple of tensors to put side by
    side (boxes (n, 4), scores (n,), label ids (n,))."""
    import torch

    rows = [
        torch.column_stack([part.float() for part in item])
        if isinstance(item, tuple)
        else item.float()
        for item in per_frame
    ]
    counts = [len(r) for r in rows]
    if not sum(counts):
        return [torch.zeros((0, columns)) for _ in rows]
    return list(torch.cat(rows).cpu().split(counts))


def _cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    import torch

    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], dim=-1)


def _nms(
    boxes: torch.Tensor, scores: torch.Tensor, label_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-category non-maximum suppression (see OPEN_VOCABULARY_NMS_IOU) on the tensors' device,
    in float32; best score first."""
    import torch
    from torchvision.ops import batched_nms

    boxes, scores = boxes.float(), scores.float()
    label_ids = torch.as_tensor(label_ids, dtype=torch.long, device=boxes.device)
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
