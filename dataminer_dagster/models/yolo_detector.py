"""The ``yolo`` detector: an ultralytics checkpoint, letterboxed, run and suppressed on the
device."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.models.batched_detector import BatchedDetector
from dataminer_dagster.models.detection_boxes import to_detections
from dataminer_dagster.models.device import DevicePlan, to_device
from dataminer_dagster.models.loading import ModelUnavailableError, load_once

if TYPE_CHECKING:
    import torch


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
    on the device, the network, the suppression of a whole batch at once (`suppress`: what
    ultralytics' `non_max_suppression` keeps) and one `scale_boxes`, without `predict`'s
    per-frame work on the CPU.
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
        from ultralytics.utils.ops import scale_boxes

        network = self.network
        with torch.inference_mode():
            rows, counts = suppress(
                network.backend(prepared.pixels), self.confidence, self.class_ids, network
            )
            # every frame of a batch has one size: their boxes are scaled back in one call
            scale_boxes(prepared.pixels.shape[2:], rows[:, :4], prepared.frame_shape)
            found = rows.cpu().split(counts)  # the one copy back of the batch
        results = []
        for frame_rows in found:
            labels = [self.names[int(c)] for c in frame_rows[:, 5].tolist()]
            results.append(
                to_detections(
                    frame_rows[:, :4],
                    frame_rows[:, 4],
                    labels,
                    prepared.frame_shape,
                    self.confidence,
                )
            )
        return results


# ultralytics' per-image limit on the boxes its non_max_suppression looks at (`max_nms`).
ULTRALYTICS_MAX_NMS = 30_000


def suppress(
    prediction: Any, confidence: float, class_ids: Sequence[int] | None, network: _YoloNetwork
) -> tuple[torch.Tensor, list[int]]:
    """ultralytics' `non_max_suppression` of a batch, for all its frames at once: (the kept rows,
    float32 (x0, y0, x1, y1, score, class id) in the network's input pixels, frame after frame,
    each frame's best first; the number of rows of each frame).

    ultralytics suppresses frame by frame, and each frame's boolean indexing waits for the device:
    on an H200 that kept the device idle for a third of a YOLO11m batch (bench/gpu.md). Here the
    candidates of every frame are found with one such wait, and torchvision's `batched_nms`
    suppresses each (frame, class) group, as ultralytics does within a frame with its class
    offset; then at most `max_det` per frame. Best class only (ultralytics' default), the same
    threshold, IoU, classes and agnostic setting. An end-to-end model, and a frame with more
    candidates than ultralytics looks at (`max_nms`), go through ultralytics' own function.
    """
    import torch
    import torchvision
    from ultralytics.utils.nms import non_max_suppression
    from ultralytics.utils.ops import xywh2xyxy

    if isinstance(prediction, (list, tuple)):  # (inference output, loss output)
        prediction = prediction[0]
    frames = prediction.shape[0]
    if not network.end2end and prediction.shape[-1] != 6:
        scores, labels = prediction[:, 4:].max(1)  # best class of each box: (frames, boxes)
        wanted = scores > confidence
        if class_ids is not None:
            wanted &= torch.isin(labels, torch.tensor(class_ids, device=labels.device))
        frame, box = wanted.nonzero(as_tuple=True)
        counts = torch.bincount(frame, minlength=frames)
        if counts.max() <= ULTRALYTICS_MAX_NMS:
            xyxy = xywh2xyxy(prediction[frame, :4, box]).float()  # in its precision, as there
            score, label = scores[frame, box].float(), labels[frame, box]
            group = frame if network.agnostic else frame * prediction.shape[1] + label
            kept = torchvision.ops.batched_nms(xyxy, score, group, network.iou)  # best first
            kept = kept[torch.sort(frame[kept], stable=True).indices]  # frame by frame
            kept_frames = frame[kept]
            per_frame = torch.bincount(kept_frames, minlength=frames)
            first = torch.cumsum(per_frame, 0) - per_frame
            rank = torch.arange(len(kept), device=kept.device) - first[kept_frames]
            kept = kept[rank < network.max_det]
            rows = torch.column_stack((xyxy[kept], score[kept], label[kept].float()))
            return rows, per_frame.clamp(max=network.max_det).tolist()
    per_frame = non_max_suppression(
        prediction,
        confidence,
        network.iou,
        class_ids,
        network.agnostic,
        max_det=network.max_det,
        nc=0,  # a detection model: every channel after the box is a class
        end2end=network.end2end,
    )
    rows = [frame_rows[:, :6].float() for frame_rows in per_frame]
    return torch.cat(rows), [len(frame_rows) for frame_rows in rows]


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
