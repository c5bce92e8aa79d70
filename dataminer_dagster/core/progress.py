"""Progress lines for long steps (percent, rate and ETA, at most every few seconds), and lines that
would repeat themselves (every item of a batch postponed for want of disk space), said at most
once a minute with a count of those left out."""

from __future__ import annotations

import threading
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


class RepeatedLines:
    """Lines that say the same thing again and again, said at most once per `every_s` for each
    topic, each with the count of the lines left out since the one before. Shared by threads."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.every_s = every_s
        self._clock = clock
        self._said_at: dict[str, float] = {}
        self._left_out: dict[str, int] = {}
        self._lock = threading.Lock()

    def line(self, topic: str, message: str) -> str | None:
        """`message` to say now, with the count of those left out before it; None to leave it
        out, when a line of `topic` was said less than `every_s` ago."""
        now = self._clock()
        with self._lock:
            said_at = self._said_at.get(topic)
            if said_at is not None and now - said_at < self.every_s:
                self._left_out[topic] = self._left_out.get(topic, 0) + 1
                return None
            self._said_at[topic] = now
            left_out = self._left_out.pop(topic, 0)
        if not left_out or said_at is None:
            return message
        return (
            f"{message} ({left_out} more like it in the {format_seconds(now - said_at)} "
            "before were not logged)"
        )


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
