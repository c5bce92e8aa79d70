"""A local HTTP host that throttles like a video site, and keeps its own account of what it saw.

    with ThrottlingHost(root, allowance=6, window_s=2.0, bot_checks={"v07"}, stalling={"v11"},
                        expiring={"v13"}) as host:
        url = host.page_url("v07")
        ...
        assert host.stats.requests_during_pause == 0

Videos are `root/media/<name>.mp4`. Each has a watch page, `/watch/<name>`, whose `<video>` points
at `/media/<name>.mp4?t=<token>` with a fresh token per page view, as a video site's stream URLs
are: yt-dlp's generic extractor asks for the page (metadata), then for the stream.

* **Allowance**: at most `allowance` requests are served per window of `window_s` seconds (fixed
  windows from the first request). Beyond it, requests get 429 with `Retry-After` = the seconds
  to the window's end, rounded up (so a client that honours it asks again in the next window).
* **Bot checks**: the first request for the page of each video in `bot_checks` gets a 403 page
  that asks to "confirm you're not a bot", and the host then answers every request with that page
  for `bot_block_s`.
* **Expired stream URLs**: the first stream request served for each video in `expiring` gets a
  bare 403 (its URL "expired"); a fresh page view gives a URL that works.
* **Stalls**: the first stream request served for each video in `stalling` sends
  `stall_after_bytes`, then stays silent for `stall_s` and closes.
* **Slow bodies**: every other stream sends its body over `body_s` seconds, so that downloads of
  several runs overlap (at most `max_downloads_per_host` may).
* `close_for(seconds)`: from now on, every request gets 429 with that Retry-After.

`stats` counts, by the host's own clock and log: requests served and refused, **requests during a
pause** (a request in a window after that window's first refusal, or during a bot block: a
client that honours the host's answers sends none), bot pages, expiries, stalls, and the most
videos transferring at once.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.http_server import LocalHTTPServer, RecordedRequest, Route

BOT_PAGE = (
    b"<html><head><title>YouTube</title></head><body><p>Sign in to confirm you\xe2\x80\x99re not "
    b"a bot. This helps protect our community.</p></body></html>"
)
_PAGE = re.compile(r"/watch/([\w-]+)$")
_STREAM = re.compile(r"/media/([\w-]+)\.mp4$")


@dataclass
class HostStats:
    served: int = 0  # requests answered within the allowance (pages, streams, expiries, stalls)
    refused: int = 0  # 429 answers
    refused_windows: int = 0  # windows with at least one refusal
    requests_during_pause: int = 0
    bot_pages: int = 0
    expired: int = 0
    stalled: int = 0
    max_videos_at_once: int = 0


class ThrottlingHost(LocalHTTPServer):
    def __init__(
        self,
        root: Path,
        *,
        allowance: int,
        window_s: float,
        bot_checks: set[str] = frozenset(),
        bot_block_s: float = 0.4,
        expiring: set[str] = frozenset(),
        stalling: set[str] = frozenset(),
        stall_after_bytes: int = 2000,
        stall_s: float = 2.0,
        body_s: float = 0.0,
    ):
        super().__init__(root)
        self.allowance = allowance
        self.window_s = window_s
        self.bot_block_s = bot_block_s
        self.stall_after_bytes = stall_after_bytes
        self.stall_s = stall_s
        self.body_s = body_s
        self.stats = HostStats()
        self._bot_checks = set(bot_checks)  # names whose next page view meets a bot check
        self._expiring = set(expiring)  # names whose next stream request expires
        self._stalling = set(stalling)  # names whose next stream request stalls
        self._t0: float | None = None
        self._served_in: Counter[int] = Counter()  # window -> requests served
        self._refused_in: set[int] = set()
        self._bot_block_until = 0.0
        self._closed_retry_after: int | None = None
        self._tokens = itertools.count(1)
        self._transferring: dict[int, str] = {}  # id(request) -> video name

    def page_url(self, name: str) -> str:
        return self.url(f"/watch/{name}")

    def close_for(self, seconds: int) -> None:
        """Refuse every request from now on, asking to come back in `seconds`."""
        with self._lock:
            self._closed_retry_after = seconds

    def served_per_window(self) -> list[int]:
        """Requests served in each window so far, from the first."""
        with self._lock:
            return [self._served_in[w] for w in range(max(self._served_in, default=-1) + 1)]

    # -- the host's answers -------------------------------------------------------------------

    def _route_for(self, path: str, record: RecordedRequest) -> tuple[Route | None, bool]:
        page, stream = _PAGE.match(path), _STREAM.match(path)
        with self._lock:
            refusal = self._refusal(record, page)
            if refusal is not None:
                return refusal, True
            if page is not None:
                return self._page(page.group(1)), True
            if stream is not None:
                return self._stream(stream.group(1), record)
            return None, False

    def _refusal(self, record: RecordedRequest, page) -> Route | None:
        """A bot check or a 429, or None when the request is served (and counted)."""
        now = record.at
        if self._t0 is None:
            self._t0 = now
        window = int((now - self._t0) // self.window_s)
        if self._closed_retry_after is not None:
            self.stats.refused += 1
            return _too_many(self._closed_retry_after)
        if now < self._bot_block_until:
            self.stats.requests_during_pause += 1
            return self._bot_page()
        if page is not None and page.group(1) in self._bot_checks:
            self._bot_checks.discard(page.group(1))
            self._bot_block_until = now + self.bot_block_s
            return self._bot_page()
        if self._served_in[window] >= self.allowance:
            if window in self._refused_in:
                self.stats.requests_during_pause += 1
            else:
                self._refused_in.add(window)
                self.stats.refused_windows += 1
            self.stats.refused += 1
            window_end = self._t0 + (window + 1) * self.window_s
            return _too_many(max(1, math.ceil(window_end - now)))
        self._served_in[window] += 1
        self.stats.served += 1
        return None

    def _page(self, name: str) -> Route:
        stream = f"/media/{name}.mp4?t={next(self._tokens)}"
        html = f'<html><head><title>{name}</title></head><body><video src="{stream}"></video>'
        return Route(status=200, body=f"{html}</body></html>".encode(), content_type="text/html")

    def _stream(self, name: str, record: RecordedRequest) -> tuple[Route | None, bool]:
        if name in self._expiring:
            self._expiring.discard(name)
            self.stats.expired += 1
            return Route(status=403, body=b"Forbidden: this stream URL has expired"), True
        self._transferring[id(record)] = name
        self.stats.max_videos_at_once = max(
            self.stats.max_videos_at_once, len(set(self._transferring.values()))
        )
        if name in self._stalling:
            self._stalling.discard(name)
            self.stats.stalled += 1
            return Route(cut_after_bytes=self.stall_after_bytes, stall_s=self.stall_s), False
        return (Route(body_s=self.body_s) if self.body_s else None), False

    def _transfer_ended(self, record: RecordedRequest) -> None:
        with self._lock:
            self._transferring.pop(id(record), None)

    def _bot_page(self) -> Route:
        self.stats.bot_pages += 1
        return Route(status=403, body=BOT_PAGE, content_type="text/html; charset=utf-8")


def _too_many(retry_after: int) -> Route:
    return Route(status=429, headers={"Retry-After": str(retry_after)})


def write_videos(root: Path, names: list[str], clip: Path) -> None:
    """The host's videos: copies of one clip, `root/media/<name>.mp4`."""
    media = root / "media"
    media.mkdir(parents=True, exist_ok=True)
    for name in names:
        (media / f"{name}.mp4").write_bytes(clip.read_bytes())
