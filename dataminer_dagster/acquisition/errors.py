"""The outcomes of a search or a download other than success, as the stages sort them:

* `DownloadBlocked`: a rule says "do not download" (final, but not a failure);
* `PermanentDownloadError`: retrying cannot help (404, private, removed, age-restricted);
* `RetryableDownloadError`: try again later (5xx, timeouts, a host too slow, unknown errors);
* `HostPaused`: not the video's fault: its host throttles us (429, 503, a bot check, a
  Retry-After) and every run leaves it alone until the pause ends; no attempt is used.

and what they carry: the host's answer that means "stop" (`ThrottleSignal`) and the pause it
led to (`Pause`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dataminer_dagster.core.progress import format_seconds


@dataclass(frozen=True)
class ThrottleSignal:
    """A host's answer that means "stop for a while"."""

    kind: str  # "rate limited", "overloaded" or "bot check"
    detail: str  # what the host answered, e.g. "HTTP 429"
    retry_after: float | None = None  # seconds, from the host's Retry-After

    def describe(self) -> str:
        after = (
            f", Retry-After {format_seconds(self.retry_after)}"
            if self.retry_after is not None
            else ""
        )
        return f"{self.kind} ({self.detail}{after})"


@dataclass(frozen=True)
class Pause:
    """A host (throttle key) that no run may send a request to before `until`."""

    host: str
    until: datetime
    remaining_s: float  # when this was read
    kind: str
    reason: str
    retry_after: float | None = None  # the host's Retry-After, when this call met the pause

    def describe(self) -> str:
        return (
            f"host {self.host} is paused until {self.until:%Y-%m-%d %H:%M:%S %Z} "
            f"({format_seconds(max(self.remaining_s, 0.0))} left): {self.reason}"
        )


class VideoDownloadError(Exception):
    """Base of the download outcomes other than success."""


class DownloadBlocked(VideoDownloadError):
    """A rule excludes the video (blocked hashtag, too long, too large). Not an error to retry."""

    def __init__(self, message: str, *, rule: str):
        super().__init__(message)
        self.rule = rule  # "hashtag", "duration", "filesize" or "live"


class PermanentDownloadError(VideoDownloadError):
    """Retrying cannot help: the video is gone, private, unsupported, or not a video."""


class RetryableDownloadError(VideoDownloadError):
    """Transient: server errors, timeouts, an expired stream URL, or an unrecognised error."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        signal: ThrottleSignal | None = None,
    ):
        super().__init__(message)
        # seconds, from a Retry-After header when the server sent one
        self.retry_after = retry_after
        # set when the error says the host throttles us (a bot check in an extractor's message)
        self.signal = signal


class DownloadTooSlow(RetryableDownloadError):
    """The transfer went slower than the minimum speed over its window, or past the download's
    deadline: given up so that the run goes on. Retryable, and the attempt counts: a host that is
    slow for one try may not be for the next, but one that always is must end the item dead, or
    its project would never complete."""


class HostPaused(RetryableDownloadError):
    """The host is paused: this call met its throttle (`met`), or found it paused for longer
    than the caller may wait. The item goes back without using an attempt until `pause.until`."""

    def __init__(self, pause: Pause, *, met: bool, subject: str | None = None):
        text = pause.describe()
        super().__init__(f"{subject}: {text}" if subject else text, retry_after=pause.retry_after)
        self.pause = pause
        self.met = met

    def about(self, subject: str) -> HostPaused:
        """The same pause, in a message that names the video or search."""
        return HostPaused(self.pause, met=self.met, subject=subject)
