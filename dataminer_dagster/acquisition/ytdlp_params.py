"""How yt-dlp is called: the YoutubeDL parameters made from a download's settings
(`YtDlpOptions`: what the client reads of them; the download stage's `DownloadConfig` is one),
the logger that keeps yt-dlp's output off the terminal, and the reading of
numbers from its answers.

The downloads (`assets/download/fetch.py`) and the searches (`ytdlp_search`) both start from these.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from dataminer_dagster.acquisition.politeness import PausePolicy
from dataminer_dagster.core.redact import redact


class YtDlpOptions(Protocol):
    """What the yt-dlp client reads of a download's settings (the download stage's
    `DownloadConfig` has each, and says what it means): the client imports no stage's config."""

    format: str | None
    max_height: int | None
    timeout_s: float
    retries: int
    max_filesize_mb: float
    cookies_file: Path | None
    sleep_requests_s: float | None
    allow_private_networks: bool
    proxies: list[str]

    @property
    def rate_limit_bytes(self) -> int | None: ...

    @property
    def pauses(self) -> PausePolicy: ...

    def for_host(self, host: str) -> YtDlpOptions:
        """These settings with the host's own (its site's pace, its sleeps)."""
        ...


_ytdlp_logger = logging.getLogger(f"{__name__}.yt_dlp")


def default_format(max_height: int | None) -> str:
    """One format that contains video (with or without audio): never a merge, so no ffmpeg.

    Under a height cap: the best format at or below the cap (formats of unknown height count as
    fitting), otherwise the smallest one above it.
    """
    if max_height is None:
        return "bv*"
    return f"bv*[height<=?{int(max_height)}]/wv*"


def ytdlp_params(options: YtDlpOptions, proxy: str | None = None) -> dict[str, Any]:
    """The YoutubeDL parameters for `options` and this call's proxy (without per-download paths
    and hooks)."""
    params: dict[str, Any] = {
        "format": options.format or default_format(options.max_height),
        "socket_timeout": options.timeout_s,
        "retries": options.retries,
        "fragment_retries": options.retries,
        "extractor_retries": options.retries,
        "file_access_retries": options.retries,
        "retry_sleep_functions": {
            "http": _retry_sleep,
            "fragment": _retry_sleep,
            "extractor": _retry_sleep,
        },
        "noplaylist": True,
        # A playlist or channel URL must not resolve every entry: we reject it as "not a video".
        "extract_flat": "in_playlist",
        "quiet": True,
        "noprogress": True,
        "color": "no_color",
        "logger": YtdlpLogger(),
    }
    params["max_filesize"] = max_filesize_bytes(options)
    if options.cookies_file is not None:
        params["cookiefile"] = str(options.cookies_file)
    if options.sleep_requests_s:
        params["sleep_interval_requests"] = options.sleep_requests_s
    if options.rate_limit_bytes is not None:
        params["ratelimit"] = options.rate_limit_bytes
    if proxy:
        params["proxy"] = proxy
    if deno := deno_path():
        params["js_runtimes"] = {"deno": {"path": deno}}
    return params


def download_params(options: YtDlpOptions, proxy: str | None = None) -> dict[str, Any]:
    """`ytdlp_params` for downloading one video: a playlist URL (refused as not a video) is
    enumerated no further than its first entry, since some never end (mixes, channels' streams)."""
    return ytdlp_params(options, proxy) | {"playlist_items": "1"}


def max_filesize_bytes(options: YtDlpOptions) -> int:
    return int(options.max_filesize_mb * 1024 * 1024)


@functools.cache
def deno_path() -> str | None:
    """The deno binary from the `deno` package: yt-dlp needs a JS runtime for YouTube."""
    try:
        import deno
    except ImportError:
        return None
    try:
        path = deno.find_deno_bin()
    except FileNotFoundError:
        return None
    return path if os.access(path, os.X_OK) else None


def _retry_sleep(n: int) -> float:
    """Seconds before yt-dlp's retry number n+1 (yt-dlp passes `n` by keyword)."""
    return min(2.0**n, 10.0)


def private_cookies(cookies_file: Path, work_dir: Path) -> Path:
    """yt-dlp writes cookies back on exit: give it a copy so parallel runs never clobber the file."""
    if not Path(cookies_file).is_file():
        # A configuration error, not an outcome of this video: not a VideoDownloadError.
        raise FileNotFoundError(f"cookies file {cookies_file} (option cookies_file) does not exist")
    copy = work_dir / "cookies.txt"
    shutil.copyfile(cookies_file, copy)
    return copy


def positive_number(value: Any) -> float | None:
    """A number from yt-dlp's metadata (a duration, a frame rate); None when it is missing or
    not above zero."""
    return float(value) if isinstance(value, int | float) and value > 0 else None


class YtdlpLogger:
    """yt-dlp's `logger` parameter: everything goes to logging, nothing to stdout.

    Errors are logged at debug level because they are raised (classified) to the caller anyway.
    The last messages are kept to explain outcomes yt-dlp reports only in text. yt-dlp names the
    URL it fetches, so every message is redacted first.
    """

    def __init__(self) -> None:
        self._recent: deque[str] = deque(maxlen=20)

    def debug(self, message: str) -> None:
        _ytdlp_logger.debug("%s", self._keep(message).removeprefix("[debug] "))

    def info(self, message: str) -> None:
        self.debug(message)

    def warning(self, message: str) -> None:
        _ytdlp_logger.warning("%s", self._keep(message))

    def error(self, message: str) -> None:
        _ytdlp_logger.debug("%s", self._keep(message))

    def _keep(self, message: str) -> str:
        redacted = redact(message)
        self._recent.append(redacted)
        return redacted

    def saw(self, fragment: str) -> bool:
        return any(fragment in message for message in self._recent)

    def tail(self, count: int = 3) -> str:
        return " / ".join(list(self._recent)[-count:]) or "none"
