"""Progress lines for long steps: percent, rate and ETA, at most every few seconds."""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        emit: Callable[[str], None],
        *,
        every_s: float = 10.0,
        unit: str = "items",
    ):
        self.label, self.total, self.emit, self.every_s, self.unit = (
            label,
            total,
            emit,
            every_s,
            unit,
        )
        self.done = 0
        self.started = time.monotonic()
        self._last = self.started

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done >= self.total:
            self._last = now
            self.emit(self.line(note))

    def line(self, note: str = "") -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        remaining = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta = f", ETA {format_seconds(remaining)}" if self.done < self.total and rate > 0 else ""
        suffix = f" ({note})" if note else ""
        return f"{self.label}: {self.done}/{self.total} {self.unit} ({pct:.0f}%), {rate:.2f} {self.unit}/s{eta}{suffix}"


def format_seconds(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
