"""How slow one download may be: a minimum speed over a window, and a deadline for the whole of it.

A host that trickles (a few hundred bytes every few seconds, with a correct Content-Length) never
trips the per-read timeout (`download.timeout_s`), and would hold its run for hours. `DownloadPace`
is checked each time data arrives (yt-dlp's progress hook, `fetch.py`) and gives up with
DownloadTooSlow; a host that sends nothing at all is ended by the per-read timeout instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from dataminer_dagster.acquisition.errors import DownloadTooSlow
from dataminer_dagster.assets.download.config import DownloadConfig


class DownloadPace:
    """The pace of one download, from its first request (the deadline) and its first bytes (the
    speed: the bytes of the last `min_speed_window_s` seconds, once the transfer is that old)."""

    def __init__(
        self,
        options: DownloadConfig,
        subject: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._options = options
        self._subject = subject
        self._clock = clock
        self._started = clock()
        # (time, bytes downloaded) as data arrived; the first is the newest one at least a window
        # old, once the transfer is that old.
        self._seen: deque[tuple[float, int]] = deque()

    def check(self, downloaded_bytes: int) -> None:
        """Raise DownloadTooSlow past the deadline, or when the last window moved fewer bytes than
        the minimum speed."""
        now = self._clock()
        options = self._options
        if now - self._started > options.max_download_s:
            raise DownloadTooSlow(
                f"{self._subject}: the download took longer than download.max_download_s "
                f"({options.max_download_s:g} s); given up after "
                f"{_kilobytes(downloaded_bytes)} KB"
            )
        if options.min_speed_bytes_s is None:
            return
        window = options.min_speed_window_s
        self._seen.append((now, downloaded_bytes))
        while len(self._seen) > 1 and self._seen[1][0] <= now - window:
            self._seen.popleft()
        since, then = self._seen[0]
        if now - since < window:
            return
        moved = downloaded_bytes - then
        if moved < options.min_speed_bytes_s * (now - since):
            raise DownloadTooSlow(
                f"{self._subject}: the download was too slow: {_kilobytes(moved)} KB in the last "
                f"{now - since:.0f} s, under download.min_speed_kb_s "
                f"({options.min_speed_bytes_s / 1024:g} KB/s over download.min_speed_window_s, "
                f"{window:g} s); given up after {_kilobytes(downloaded_bytes)} KB"
            )


def _kilobytes(size: int) -> str:
    return f"{size / 1024:,.1f}"
