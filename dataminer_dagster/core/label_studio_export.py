"""What a reviewer answered in a task of Label Studio's JSON export, whatever was asked: the
dataset's review (boxes) and the filter's calibration (yes or no) read their answers through it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def task_answer(task: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The task's annotation that stands: the latest one not skipped, a ground-truth one first;
    None where nobody answered."""
    answers = [a for a in task.get("annotations") or [] if not a.get("was_cancelled")]
    if not answers:
        return None
    return max(answers, key=lambda a: (bool(a.get("ground_truth")), _when(a)))


def _when(annotation: Mapping[str, Any]) -> str:
    return str(annotation.get("updated_at") or annotation.get("created_at") or "")
