"""yt-dlp under the host throttle (`acquisition.politeness`), for downloads and searches alike.

Every HTTP request yt-dlp makes (pages, APIs, media) goes through a `HostThrottle`: it waits for
its host's turn and for the end of a pause, and an answer that says "stop" (429, 503, a bot check,
a Retry-After) pauses the host for every run. A call that meets a pause short enough to wait for
(`HostThrottle.max_wait_s`) waits and tries again; else it raises HostPaused. Proxies are used in
turn, skipping those the host has paused.

yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from dataminer_dagster.acquisition.egress import EgressRefused, egress_checked
from dataminer_dagster.acquisition.errors import (
    HostPaused,
    RetryableDownloadError,
    VideoDownloadError,
)
from dataminer_dagster.acquisition.politeness import (
    HostThrottle,
    host_key,
    throttle_key,
    throttle_signal,
)
from dataminer_dagster.acquisition.ytdlp_errors import classify_ytdlp_error
from dataminer_dagster.core.files import InsufficientDiskSpace

# A call that meets a pause it may wait for tries again at most this often before giving up.
_PAUSED_TRIES = 4
_ERROR_PAGE_BYTES = 64 * 1024


def politely(call: Callable[[], Any], throttle: HostThrottle) -> Any:
    """`call()`, tried again when it met a pause short enough to wait for (the next request
    waits for its end in `HostThrottle.request_turn`)."""
    for attempt in itertools.count(1):
        try:
            return call()
        except HostPaused as exc:
            if not exc.met or attempt >= _PAUSED_TRIES or not throttle.can_wait(exc.pause):
                raise
    raise AssertionError("unreachable")


_proxy_turns = itertools.count()


def next_proxy(proxies: tuple[str, ...], host: str, throttle: HostThrottle) -> str | None:
    """The next proxy in turn, skipping those paused for `host` while another is free; when all
    are paused, the one whose pause ends first."""
    if not proxies:
        return None
    start = next(_proxy_turns)
    order = [proxies[(start + i) % len(proxies)] for i in range(len(proxies))]
    remaining: dict[str, float] = {}
    for proxy in order:
        pause = throttle.current_pause(throttle_key(host, proxy))
        if pause is None:
            return proxy
        remaining[proxy] = pause.remaining_s
    return min(order, key=remaining.__getitem__)


def classified(
    exc: BaseException, subject: str, throttle: HostThrottle, key: str
) -> VideoDownloadError | InsufficientDiskSpace:
    """classify_ytdlp_error, with a throttle signal in the message (a bot check) pausing the host."""
    error = classify_ytdlp_error(exc, subject=subject)
    if isinstance(error, RetryableDownloadError) and error.signal is not None:
        return HostPaused(throttle.record_pause(key, error.signal), met=True, subject=subject)
    return error


@contextlib.contextmanager
def ytdlp_session(
    params: dict[str, Any],
    *,
    subject: str,
    host: str,
    throttle: HostThrottle,
    proxy: str | None,
    allow_private_networks: bool,
    before_classifying: Callable[[], None] = lambda: None,
) -> Iterator[Any]:
    """A gated YoutubeDL (`gated_ytdlp`) for `params`, whose failures are told as `subject`'s: a
    host's pause as HostPaused about it, an egress refusal with it in front, any other yt-dlp
    error sorted into the outcomes of `acquisition.errors` (`classified`). `before_classifying`
    runs before a pause or a yt-dlp error is told (a download's progress hook raises its own
    error there, which yt-dlp wrapped)."""
    from yt_dlp.utils import YoutubeDLError

    try:
        with gated_ytdlp()(
            params,
            throttle=throttle,
            proxy=proxy,
            allow_private_networks=allow_private_networks,
        ) as ydl:
            yield ydl
    except HostPaused as exc:
        before_classifying()
        raise exc.about(subject) from exc
    except EgressRefused as exc:
        raise EgressRefused(f"{subject}: {exc}") from exc
    except YoutubeDLError as exc:
        before_classifying()
        raise classified(exc, subject, throttle, throttle_key(host, proxy)) from exc


@functools.cache
def gated_ytdlp():
    """YoutubeDL whose every HTTP request (pages, APIs, media) takes its host's turn, waits out the
    host's pause, pauses the host when the answer says stop, and connects only where the egress
    policy allows (`acquisition.egress`; redirects included)."""
    from yt_dlp import YoutubeDL
    from yt_dlp.networking.exceptions import HTTPError

    class GatedYoutubeDL(YoutubeDL):
        def __init__(
            self,
            params: dict[str, Any],
            *,
            throttle: HostThrottle,
            proxy: str | None,
            allow_private_networks: bool,
        ):
            super().__init__(params)
            self._throttle = throttle
            self._proxy = proxy
            self._allow_private = allow_private_networks

        def urlopen(self, req):
            url = getattr(req, "url", None) or getattr(req, "full_url", None) or str(req)
            with self._throttle.request_turn(throttle_key(host_key(url), self._proxy)) as turn:
                try:
                    with egress_checked(
                        allow_private=self._allow_private, url=url, proxy=self._proxy
                    ):
                        response = super().urlopen(req)
                except HTTPError as err:
                    headers = err.response.headers
                    signal = throttle_signal(err.status, headers, _error_page(err.response))
                    if signal is None:
                        raise
                    pause = self._throttle.paused(turn.pause(signal))
                    raise HostPaused(pause, met=True) from err
                turn.succeeded()
                return response

    return GatedYoutubeDL


def _error_page(response) -> str:
    """The start of an error answer's text (a bot-check page says so only there), put back for
    yt-dlp to read."""
    content_type = (response.headers.get("Content-Type") or "").lower()
    if not content_type.startswith(("text/", "application/json")):
        return ""
    try:
        data = response.read(_ERROR_PAGE_BYTES)
    except Exception:  # an unreadable error body: judge the answer by its status alone
        return ""
    response.fp = _ReadAgain(data)
    return data.decode("utf-8", "replace")


class _ReadAgain(io.BytesIO):
    """An error body already read, for yt-dlp to read again (its `requests` handler passes
    urllib3's `decode_content`)."""

    def read(self, size: int | None = -1, **_urllib3_options) -> bytes:
        return super().read(-1 if size is None else size)
