"""A detector's boxes from the device to `Detection`s: one copy back per batch, then clipped to
the frame, without empty boxes, best score first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dataminer_dagster.core.coco import Detection

if TYPE_CHECKING:
    import torch


def to_host(per_frame: Sequence[Any], columns: int = 6) -> list[torch.Tensor]:
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


def to_detections(
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
