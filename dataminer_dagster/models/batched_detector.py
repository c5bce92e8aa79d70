"""The batching every detector shares (`BatchedDetector`).

Frames are processed in batches grouped by frame size, so that a frame gets the same result
whatever else is in its batch. Each batch is stacked once (into page-locked memory on CUDA), copied
to the device as uint8 and preprocessed there: YOLO's letterbox as tensor ops
(`yolo_detector.Letterbox`), the transformers detectors' own torchvision image processors on device
tensors. The network, the suppression of overlapping boxes and their scaling to the frame run on
the device too; one copy per batch brings the boxes back (`detection_boxes`). On CUDA a thread
prepares the next batches on a stream of its own while the model runs, and a batch holds as many
frames as fit in half the free device memory, up to `batch_size` (`models.device`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from dataminer_dagster.core.coco import Detection
from dataminer_dagster.models.device import (
    DevicePlan,
    PrefetchThreads,
    finish_stream,
    plan_batch_size,
    prepared_ahead,
)

# Frames per model call when no batch size is configured: on the CPU, and on CUDA the most that a
# batch sized from the free memory takes (the batch of YOLO's H200 measurement, bench/gpu.md).
DEFAULT_BATCH_SIZE = 8
AUTO_BATCH_LIMIT = 32


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
