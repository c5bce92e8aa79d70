"""yt-dlp's errors sorted into the outcomes of `acquisition.errors` (permanent, retryable, or a
sign that the host throttles us), with a reason a user can read. A full disk is none of these:
yt-dlp reports a failed write in words ("unable to write data: [Errno 28] No space left on
device"), and it becomes the InsufficientDiskSpace that postpones an item in any stage.

yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import re

from dataminer_dagster.acquisition.errors import (
    PermanentDownloadError,
    RetryableDownloadError,
    ThrottleSignal,
    VideoDownloadError,
)
from dataminer_dagster.acquisition.politeness import is_bot_check, parse_retry_after
from dataminer_dagster.core.files import InsufficientDiskSpace, disk_full, says_disk_full

_HTTP_STATUS_IN_TEXT = re.compile(r"HTTP Error (\d{3})")

# Checked in this order on the lower-cased messages of the whole exception chain, after the bot
# check (politeness.BOT_CHECK_MARKERS), which pauses the host.
_RETRYABLE_FIRST = (("try again later", "the site asks to try again later"),)
_PERMANENT_MARKERS = (
    ("private video", "the video is private"),
    ("video is private", "the video is private"),
    ("this video has been removed", "the video has been removed"),
    ("video unavailable", "the video is unavailable"),
    ("this video is no longer available", "the video is no longer available"),
    ("account associated with this video has been terminated", "the uploader's account is gone"),
    ("unsupported url", "yt-dlp does not support this URL"),
    ("confirm your age", "the video is age-restricted (needs a cookies file of an adult account)"),
    ("age-restricted", "the video is age-restricted (needs a cookies file of an adult account)"),
    (
        "inappropriate for some users",
        "the video is age-restricted (needs a cookies file of an adult account)",
    ),
    ("members-only", "the video is for channel members only"),
    ("join this channel", "the video is for channel members only"),
    ("available in your country", "the video is blocked in this country"),
    ("did not get any data blocks", "the server sent an empty file"),
    # yt-dlp follows a redirect 30 times before it says so; the address itself is broken.
    ("redirect loop", "the address redirects in a loop and never reaches a video"),
    ("too many redirects", "the address redirects in a loop and never reaches a video"),
)
_RETRYABLE_MARKERS = (
    ("timed out", "the connection timed out"),
    ("timeout", "the connection timed out"),
    ("connection reset", "the connection was reset"),
    ("connection refused", "the connection was refused"),
    ("connection aborted", "the connection was aborted"),
    ("remote end closed", "the server closed the connection"),
    ("temporary failure in name resolution", "the host name could not be resolved"),
    ("content too short", "the download was cut short"),
    ("more expected", "the download was cut short"),
    ("incomplete", "the download was cut short"),
    ("this live event will begin", "the live event has not started yet"),
    ("premieres in", "the premiere has not started yet"),
)
# 403 included: YouTube answers it for expired media URLs (a download fetches fresh metadata at
# once, `stream_url_refused`); a later attempt can work.
_RETRYABLE_4XX = frozenset({403, 408, 425, 429})


def classify_ytdlp_error(
    exc: BaseException, *, subject: str
) -> VideoDownloadError | InsufficientDiskSpace:
    """Map a yt-dlp exception (and its causes) to Permanent/Retryable, with a readable reason.
    An error that says the host throttles us (a bot check, 429, 503) carries its `signal`; one
    that says the disk is full is InsufficientDiskSpace."""
    chain = list(_exception_chain(exc))
    messages = [_clean_message(e) for e in chain]
    text = _summary(messages)
    lowered = " | ".join(messages).lower()
    if says_disk_full(lowered) or any(disk_full(e) for e in chain):
        return InsufficientDiskSpace(f"{subject}: the disk is full: {text}")
    retry_after = _retry_after(chain)
    if is_bot_check(lowered):
        signal = ThrottleSignal(
            "bot check", "the site asks to confirm this is not a bot", retry_after
        )
        return RetryableDownloadError(
            f"{subject}: the site asks to confirm this is not a bot (the host is paused; a "
            f"cookies file may help): {text}",
            retry_after=retry_after,
            signal=signal,
        )
    for marker, reason in _RETRYABLE_FIRST:
        if marker in lowered:
            return RetryableDownloadError(f"{subject}: {reason}: {text}", retry_after=retry_after)
    status = _http_status(chain, text)
    if status in (429, 503):
        kind = "rate limited" if status == 429 else "overloaded"
        return RetryableDownloadError(
            f"{subject}: {kind} (HTTP {status}){_after(retry_after)}: {text}",
            retry_after=retry_after,
            signal=ThrottleSignal(kind, f"HTTP {status}", retry_after),
        )
    if status is not None and 400 <= status < 500 and status not in _RETRYABLE_4XX:
        return PermanentDownloadError(f"{subject}: HTTP {status}: {text}")
    if status is not None and (status >= 500 or status in _RETRYABLE_4XX):
        return RetryableDownloadError(f"{subject}: HTTP {status}: {text}", retry_after=retry_after)
    if _is_geo_or_unsupported(chain):
        return PermanentDownloadError(f"{subject}: {text}")
    for marker, reason in _PERMANENT_MARKERS:
        if marker in lowered:
            return PermanentDownloadError(f"{subject}: {reason}: {text}")
    for marker, reason in _RETRYABLE_MARKERS:
        if marker in lowered:
            return RetryableDownloadError(f"{subject}: {reason}: {text}", retry_after=retry_after)
    if any(isinstance(e, TimeoutError | ConnectionError) for e in chain) or _is_transport(chain):
        return RetryableDownloadError(f"{subject}: network error: {text}", retry_after=retry_after)
    return RetryableDownloadError(
        f"{subject}: unrecognised yt-dlp error, treated as retryable: {text}",
        retry_after=retry_after,
    )


def stream_url_refused(exc: BaseException) -> bool:
    """The media request was refused with 403: what YouTube answers for an expired stream URL."""
    return _http_status(list(_exception_chain(exc)), "") == 403


def _exception_chain(exc: BaseException):
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        exc_info = getattr(current, "exc_info", None)
        nested = exc_info[1] if isinstance(exc_info, tuple) and len(exc_info) > 1 else None
        cause = getattr(current, "cause", None)
        pending.extend(
            e
            for e in (nested, cause, current.__cause__, current.__context__)
            if isinstance(e, BaseException)
        )


def _summary(messages: list[str]) -> str:
    """The messages of the chain, leaving out those already contained in an earlier one."""
    kept: list[str] = []
    for message in messages:
        if not any(message in earlier for earlier in kept):
            kept.append(message)
    return " | ".join(kept)


def _clean_message(exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    return message.removeprefix("ERROR: ").strip()


def _http_status(chain: list[BaseException], text: str) -> int | None:
    for exc in chain:
        for attribute in ("status", "code"):
            value = getattr(exc, attribute, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
    match = _HTTP_STATUS_IN_TEXT.search(text)
    return int(match.group(1)) if match else None


def _retry_after(chain: list[BaseException]) -> float | None:
    for exc in chain:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        value = headers.get("Retry-After") if headers is not None else None
        if value:
            return parse_retry_after(value)
    return None


def _after(retry_after: float | None) -> str:
    return f", retry after {retry_after:.0f} s" if retry_after is not None else ""


def _is_geo_or_unsupported(chain: list[BaseException]) -> bool:
    from yt_dlp.utils import GeoRestrictedError, UnsupportedError

    return any(isinstance(e, GeoRestrictedError | UnsupportedError) for e in chain)


def _is_transport(chain: list[BaseException]) -> bool:
    from yt_dlp.networking.exceptions import TransportError

    return any(isinstance(e, TransportError) for e in chain)
