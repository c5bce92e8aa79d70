"""Politeness towards the hosts videos come from: one throttle per host, shared by every run.

When a host says stop (HTTP 429 or 503, a bot-check page, a `Retry-After`), the host is *paused*:
no run sends it a request until the pause ends. The pause honours `Retry-After`; without one it
is exponential in the pauses met in a row (`PausePolicy`), with jitter, and capped. Requests to
one host also take turns: a request is sent only once the previous one to that host has its
answer, so that the answer "stop" reaches every run before any other request leaves; several
downloads still transfer their bodies at once, up to a limit per host (`download_slot`).

`HostThrottle` is the interface the yt-dlp client uses (`throttled_ytdlp.py`, `assets/download/fetch.py`):
`request_turn` around each HTTP request, `download_slot` around each download. Two implementations:

* `SharedThrottle` (db/shared_throttle.py, on db/host_pauses.py) keeps pauses, turns and
  slots in the claim database, so that every run on every machine obeys them;
* `LocalThrottle` keeps pauses in this process only (the yt-dlp functions called on their own,
  `dataminer populate`).

Nothing here knows Dagster or SQL.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from dataminer_dagster.acquisition.errors import HostPaused, Pause, ThrottleSignal
from dataminer_dagster.core.progress import format_seconds

# One host key for the hosts one site answers from: YouTube's pages, API and media servers
# throttle as one.
_SITES = {
    "youtube.com": ("youtube.com", "youtu.be", "googlevideo.com", "youtube-nocookie.com"),
}
# Text of the pages that ask a client to prove it is human (YouTube, Google's "sorry" page).
BOT_CHECK_MARKERS = (
    "not a bot",
    "unusual traffic",
    "automated queries",
    "captcha",
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The pace of one worker where a site needs one: yt-dlp's `-t sleep` preset for YouTube (least and
# most sleep before a download, sleep between requests). Other hosts: none by default.
_SITE_SLEEPS = {"youtube.com": (10.0, 20.0, 0.75)}


def host_key(url: str) -> str:
    """The host a URL's requests count against: lower-case, without `www.`/`m.`, one key per
    site for sites that serve from several hosts (YouTube), and the port when it is not the
    scheme's default (two local servers are two hosts)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    for prefix in ("www.", "m."):
        host = host.removeprefix(prefix)
    for site, members in _SITES.items():
        if any(host == m or host.endswith(f".{m}") for m in members):
            return site
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None and port != _DEFAULT_PORTS.get(parts.scheme):
        return f"{host}:{port}"
    return host or url


@dataclass(frozen=True)
class Sleeps:
    """Randomised pauses of one worker: before each download (between `before_download_s` and
    `before_download_max_s`) and between the requests of one extraction."""

    before_download_s: float = 0.0
    before_download_max_s: float = 0.0
    between_requests_s: float = 0.0


def default_sleeps(host: str) -> Sleeps:
    """The sleeps a host gets when the project does not set them."""
    return Sleeps(*_SITE_SLEEPS.get(host, (0.0, 0.0, 0.0)))


def proxy_label(proxy: str) -> str:
    """A proxy as status and logs show it: scheme, host and port, never its credentials."""
    parts = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def throttle_key(host: str, proxy: str | None) -> str:
    """What a pause applies to: the host, as seen from one proxy (another proxy is another
    address to the host, with its own allowance)."""
    return host if not proxy else f"{host} via {proxy_label(proxy)}"


# -- signals and pauses ------------------------------------------------------------------------


def is_bot_check(text: str) -> bool:
    lowered = text.lower().replace("\u2019", "'")
    return any(marker in lowered for marker in BOT_CHECK_MARKERS)


def throttle_signal(
    status: int, headers: Mapping[str, str] | None, body: str = ""
) -> ThrottleSignal | None:
    """Whether an HTTP error answer means "stop": 429, 503, a bot-check page (whatever its
    status), or any error that names a Retry-After. None for other answers."""
    if status < 400:
        return None
    retry_after = _retry_after(headers)
    if body and is_bot_check(body):
        return ThrottleSignal(
            "bot check", f"HTTP {status}: the page asks to prove this is not a bot", retry_after
        )
    if status == 429:
        return ThrottleSignal("rate limited", "HTTP 429", retry_after)
    if status == 503:
        return ThrottleSignal("overloaded", "HTTP 503", retry_after)
    if retry_after is not None:
        return ThrottleSignal("asked to wait", f"HTTP {status}", retry_after)
    return None


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(value) if value else None


def parse_retry_after(value: str) -> float | None:
    """Seconds from a Retry-After header: either a number of seconds or an HTTP date."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class PausePolicy:
    """How long a host is paused when it says stop without a Retry-After: `base_s` the first
    time, doubling with each pause met in a row (no success in between), up to `max_s`, times a
    random factor between 0.5 and 1 so that hosts paused together do not resume together."""

    base_s: float = 60.0
    max_s: float = 3600.0

    def delay(
        self, signal: ThrottleSignal, strikes: int, rng: random.Random | None = None
    ) -> float:
        """Seconds to pause for `signal`, the `strikes`-th pause in a row (0: the first)."""
        if signal.retry_after is not None:
            return signal.retry_after
        jitter = 0.5 + (rng or random).random() * 0.5
        return min(self.max_s, self.base_s * 2.0 ** min(strikes, 60)) * jitter


# -- the interface -----------------------------------------------------------------------------


class Turn(ABC):
    """The right to send one request to a host now (no pause in force, no other request of any
    run waiting for its answer). Report what the answer meant before the turn ends."""

    def __init__(self, key: str, in_force: Pause | None):
        self.key = key
        self.in_force = in_force  # the pause found when the turn began; None: free to send

    @abstractmethod
    def pause(self, signal: ThrottleSignal) -> Pause:
        """The host said stop: pause it for every run (never shortening a pause in force)."""

    @abstractmethod
    def succeeded(self) -> None:
        """The host answered: the next pause starts again from the policy's base."""


class HostThrottle(ABC):
    """Shared pauses, request turns and download slots per host.

    `max_wait_s`: how long a caller waits in place for a pause to end; a longer pause raises
    HostPaused at once (the item goes back until then). `check` is called while waiting (a
    stage passes its lease check); `log` gets a line for each pause met or waited for."""

    def __init__(
        self,
        policy: PausePolicy,
        *,
        max_wait_s: float = 0.0,
        check: Callable[[], None] | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.policy = policy
        self.max_wait_s = max_wait_s
        self._check = check
        self._log = log
        self.waited_s = 0.0  # seconds spent waiting for pauses, slots and politeness sleeps
        self.pauses_met: list[Pause] = []

    @abstractmethod
    def current_pause(self, key: str) -> Pause | None:
        """The pause in force for `key`, if any."""

    @abstractmethod
    def _turn(self, key: str) -> AbstractContextManager[Turn]:
        """Take the host's turn (waiting for other requests' answers) and read its pause."""

    @abstractmethod
    def download_slot(self, host: str, limit: int) -> AbstractContextManager[None]:
        """Hold one of `limit` download slots of `host` (waiting for one) for a download."""

    @contextmanager
    def request_turn(self, key: str) -> Iterator[Turn]:
        """Wait until a request to `key` may be sent, and hold the turn while it is: a pause in
        force is waited out (or raises HostPaused when longer than `max_wait_s`)."""
        while True:
            with self._turn(key) as turn:
                if turn.in_force is None:
                    yield turn
                    return
                pause = turn.in_force
            self.wait_out(pause)

    def record_pause(self, key: str, signal: ThrottleSignal) -> Pause:
        """Pause `key` for a signal seen outside a request (a bot check in an extractor's
        message)."""
        with self._turn(key) as turn:
            return self.paused(turn.pause(signal))

    def paused(self, pause: Pause) -> Pause:
        """Note a pause this caller met (for its log and metadata)."""
        self.pauses_met.append(pause)
        self.say(
            f"paused host {pause.host} until {pause.until:%Y-%m-%d %H:%M:%S %Z}: {pause.reason}"
        )
        return pause

    def before_starting(self, key: str) -> None:
        """Do not start a download or search on a paused host: wait out a short pause, give up on a
        long one (HostPaused, met=False)."""
        pause = self.current_pause(key)
        if pause is not None:
            self.wait_out(pause)

    def can_wait(self, pause: Pause) -> bool:
        return pause.remaining_s <= self.max_wait_s

    def wait_out(self, pause: Pause) -> None:
        if not self.can_wait(pause):
            raise HostPaused(pause, met=False)
        self.say(
            f"waiting {format_seconds(pause.remaining_s)} for the end of a pause: {pause.describe()}"
        )
        self.sleep(pause.remaining_s)

    def sleep(self, seconds: float) -> None:
        """Sleep, checking the caller's lease every second."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self._check is not None:
                self._check()
            time.sleep(min(left, 1.0))
        self.waited_s += max(seconds, 0.0)

    def say(self, message: str) -> None:
        if self._log is not None:
            self._log(message)


# -- in this process only ----------------------------------------------------------------------


class _LocalTurn(Turn):
    def __init__(self, throttle: LocalThrottle, key: str, in_force: Pause | None):
        super().__init__(key, in_force)
        self._throttle = throttle

    def pause(self, signal: ThrottleSignal) -> Pause:
        return self._throttle._pause(self.key, signal)

    def succeeded(self) -> None:
        self._throttle._strikes.pop(self.key, None)


class LocalThrottle(HostThrottle):
    """Pauses and request turns kept in this process: what the yt-dlp functions use when no
    shared throttle is given. Download slots are not limited (one process downloads one video
    at a time unless its caller runs several)."""

    def __init__(self, policy: PausePolicy | None = None, **kwargs):
        super().__init__(policy or PausePolicy(), **kwargs)
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._until: dict[str, tuple[float, Pause]] = {}  # key -> (monotonic end, pause)
        self._strikes: dict[str, int] = {}

    def current_pause(self, key: str) -> Pause | None:
        with self._guard:
            found = self._until.get(key)
        if found is None:
            return None
        end, pause = found
        remaining = end - time.monotonic()
        if remaining <= 0:
            return None
        return Pause(pause.host, pause.until, remaining, pause.kind, pause.reason)

    @contextmanager
    def _turn(self, key: str) -> Iterator[Turn]:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield _LocalTurn(self, key, self.current_pause(key))

    def _pause(self, key: str, signal: ThrottleSignal) -> Pause:
        with self._guard:
            now = time.monotonic()
            previous = self._until.get(key)
            active = previous is not None and previous[0] > now
            strikes = self._strikes.get(key, 0)
            delay = self.policy.delay(signal, strikes)
            end = max(now + delay, previous[0] if active else 0.0)
            if not active:
                self._strikes[key] = strikes + 1
            until = datetime.now(UTC) + timedelta(seconds=end - now)
            pause = Pause(key, until, end - now, signal.kind, signal.describe(), signal.retry_after)
            self._until[key] = (end, pause)
            return pause

    def download_slot(self, host: str, limit: int) -> AbstractContextManager[None]:
        return nullcontext()
