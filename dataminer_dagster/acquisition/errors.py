"""The outcomes of a search or a download other than success, as the stages sort them:

* `DownloadBlocked`: a rule says "do not download" (final, but not a failure);
* `PermanentDownloadError`: retrying cannot help (404, private, removed, age-restricted);
* `RetryableDownloadError`: try again later (5xx, timeouts, a host too slow, unknown errors);
* `HostPaused`: not the video's fault: its host throttles us (429, 503, a bot check, a
  Retry-After) and every run leaves it alone until the pause ends; no attempt is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dataminer_dagster.acquisition.politeness import Pause, ThrottleSignal


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
