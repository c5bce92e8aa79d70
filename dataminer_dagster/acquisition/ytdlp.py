"""Downloading and searching videos with yt-dlp (its Python API; no ffmpeg binary needed).

One metadata extraction per video: the rules (blocked hashtags, duration, size) are checked on
that metadata, and the download reuses it. Files are written into a private work directory inside
`dest_dir` and moved into place (`<dest_dir>/<video_id>.<ext>`) only once they probe as a video,
so a failure never leaves a partial file behind. yt-dlp errors are sorted into the outcomes of
`acquisition.errors`, which the caller turns into claim-table states.

Every HTTP request yt-dlp makes (pages, APIs, media) goes through a `HostThrottle`
(`acquisition.politeness`): it waits for its host's turn and for the end of a pause, and an answer
that says "stop" (429, 503, a bot check, a Retry-After) pauses the host for every run. A call that
meets a pause short enough to wait for (`HostThrottle.max_wait_s`) waits and tries again; else it
raises HostPaused. A stream URL refused mid-download (expired) is fetched again at once with fresh
metadata.

yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import io
import itertools
import logging
import os
import random
import re
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataminer_dagster.acquisition.errors import (
    DownloadBlocked,
    HostPaused,
    PermanentDownloadError,
    RetryableDownloadError,
    VideoDownloadError,
)
from dataminer_dagster.acquisition.politeness import (
    HostThrottle,
    LocalThrottle,
    PausePolicy,
    ThrottleSignal,
    host_key,
    is_bot_check,
    parse_retry_after,
    throttle_key,
    throttle_signal,
)
from dataminer_dagster.acquisition.video_ids import YOUTUBE_ID, youtube_watch_url
from dataminer_dagster.core.files import require_free_space
from dataminer_dagster.core.media import VideoDecodeError, VideoProbe, probe_video
from dataminer_dagster.core.redact import redact, redact_url

logger = logging.getLogger(__name__)
_ytdlp_logger = logging.getLogger(f"{__name__}.yt_dlp")

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]+")
_DESCRIPTION_HASHTAG = re.compile(r"#(\w+)")
_HTTP_STATUS_IN_TEXT = re.compile(r"HTTP Error (\d{3})")
_MAX_FILESIZE_ABORT = "larger than max-filesize"
_UNFINISHED_LIVE = frozenset({"is_live", "post_live"})  # yt-dlp's live_status values
YOUTUBE = "youtube.com"  # the host key of searches
# A call that meets a pause it may wait for tries again at most this often before giving up.
_PAUSED_TRIES = 4
# A stream URL refused mid-download (expired) is fetched again with fresh metadata this often.
_FRESH_METADATA_TRIES = 2
_ERROR_PAGE_BYTES = 64 * 1024


@dataclass(frozen=True)
class DownloadOptions:
    max_height: int | None = None  # height cap for the default format
    format: str | None = None  # explicit yt-dlp format; default: see default_format()
    socket_timeout: float = 30
    blocked_hashtags: tuple[str, ...] = ()  # whole tags, case-insensitive, '#' optional
    max_duration_s: float | None = None
    max_filesize_mb: float | None = None
    min_free_disk_mb: float | None = None  # kept free besides the video's expected size
    cookies_file: Path | None = None  # for searches and downloads
    retries: int = 3  # yt-dlp's own retries (HTTP download, fragments, extractor)
    # politeness (config.DownloadConfig documents each)
    sleep_interval_s: float = 0.0  # random pause before each download, between these two
    max_sleep_interval_s: float = 0.0
    sleep_requests_s: float = 0.0  # yt-dlp's pause between the requests of one extraction
    rate_limit_bytes: int | None = None  # bytes per second of one download
    max_downloads_per_host: int = 2  # across every run (the throttle's download slots)
    proxies: tuple[str, ...] = ()  # used in turn, one per download or search
    pauses: PausePolicy = PausePolicy()
    max_pause_wait_s: float = 0.0  # how long a stage waits in place for a host's pause


@dataclass(frozen=True)
class VideoMetadata:
    title: str | None
    duration: float | None  # seconds
    fps: float | None
    width: int | None
    height: int | None
    uploader: str | None
    upload_date: str | None  # ISO date, YYYY-MM-DD
    tags: tuple[str, ...]
    extractor: str | None  # yt-dlp extractor, e.g. "youtube", "generic"
    webpage_url: str | None
    ext: str  # extension of the downloaded file
    size_bytes: int


@dataclass(frozen=True)
class DownloadedVideo:
    path: Path
    metadata: VideoMetadata


@dataclass(frozen=True)
class DownloadProgress:
    status: str  # "downloading" or "finished"
    downloaded_bytes: int | None
    total_bytes: int | None  # exact or estimated; None when unknown
    speed: float | None  # bytes per second
    eta: float | None  # seconds


@dataclass(frozen=True)
class SearchHit:
    video_id: str
    url: str
    title: str | None
    duration: float | None


def default_format(max_height: int | None) -> str:
    """One format that contains video (with or without audio): never a merge, so no ffmpeg.

    Under a height cap: the best format at or below the cap (formats of unknown height count as
    fitting), otherwise the smallest one above it.
    """
    if max_height is None:
        return "bv*"
    return f"bv*[height<=?{int(max_height)}]/wv*"


def ytdlp_params(options: DownloadOptions, proxy: str | None = None) -> dict[str, Any]:
    """The YoutubeDL parameters for `options` and this call's proxy (without per-download paths
    and hooks)."""
    params: dict[str, Any] = {
        "format": options.format or default_format(options.max_height),
        "socket_timeout": options.socket_timeout,
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
        "logger": _YtdlpLogger(),
    }
    if (max_bytes := _max_bytes(options)) is not None:
        params["max_filesize"] = max_bytes
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


def download_params(options: DownloadOptions, proxy: str | None = None) -> dict[str, Any]:
    """`ytdlp_params` for downloading one video: a playlist URL (refused as not a video) is
    enumerated no further than its first entry, since some never end (mixes, channels' streams)."""
    return ytdlp_params(options, proxy) | {"playlist_items": "1"}


def _max_bytes(options: DownloadOptions) -> int | None:
    if options.max_filesize_mb is None:
        return None
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


# -- rules -----------------------------------------------------------------------------------


def normalise_hashtag(tag: str) -> str:
    return tag.strip().lstrip("#").strip().casefold()


def video_hashtags(info: dict[str, Any]) -> set[str]:
    """Normalised tags: yt-dlp's `tags` plus `#word` hashtags in the title and description."""
    tags = {normalise_hashtag(t) for t in info.get("tags") or () if isinstance(t, str)}
    for field in ("title", "description"):
        text = info.get(field)
        if isinstance(text, str):
            tags.update(m.casefold() for m in _DESCRIPTION_HASHTAG.findall(text))
    tags.discard("")
    return tags


def blocked_hashtag(info: dict[str, Any], blocked: Iterable[str]) -> str | None:
    """The first blocked tag that the video carries as a WHOLE tag ("cover" != "#discover")."""
    tags = video_hashtags(info)
    for pattern in blocked:
        normalised = normalise_hashtag(pattern)
        if normalised and normalised in tags:
            return normalised
    return None


def check_download_rules(info: dict[str, Any], options: DownloadOptions, *, subject: str) -> None:
    """Raise DownloadBlocked when the metadata breaks a rule; `subject` names the video."""
    tag = blocked_hashtag(info, options.blocked_hashtags)
    if tag is not None:
        raise DownloadBlocked(
            f"{subject} is blocked: it carries the hashtag #{tag}", rule="hashtag"
        )
    _check_duration(info.get("duration"), options, subject)
    _check_filesize(_expected_size(info), options, subject)


def _check_duration(duration: float | None, options: DownloadOptions, subject: str) -> None:
    limit = options.max_duration_s
    if limit is not None and duration is not None and duration > limit:
        raise DownloadBlocked(
            f"{subject} is blocked: it lasts {duration:.1f} s, over the limit of "
            f"{options.max_duration_s:g} s",
            rule="duration",
        )


def _check_filesize(size: int | None, options: DownloadOptions, subject: str) -> None:
    limit = options.max_filesize_mb
    if limit is not None and size is not None and size > limit * 1024 * 1024:
        raise DownloadBlocked(
            f"{subject} is blocked: it is {size / 2**20:.1f} MB, over the limit of "
            f"{options.max_filesize_mb:g} MB",
            rule="filesize",
        )


def _expected_size(info: dict[str, Any]) -> int | None:
    formats = info.get("requested_formats") or [info]
    sizes = [f.get("filesize") or f.get("filesize_approx") for f in formats]
    return int(sum(sizes)) if sizes and all(sizes) else None


# -- download --------------------------------------------------------------------------------


def download_video(
    url: str,
    video_id: str,
    dest_dir: Path,
    options: DownloadOptions,
    *,
    progress: Callable[[DownloadProgress], None] | None = None,
    throttle: HostThrottle | None = None,
) -> DownloadedVideo:
    """Download `url` to `dest_dir/<video_id>.<ext>` or raise one of the VideoDownloadErrors.

    `throttle` shares the host's pauses, request turns and download slots with other runs; without
    one, pauses are kept in this call only and never waited for (HostPaused at once).
    An exception raised by `progress` (e.g. "lease lost") aborts the download and propagates as is.
    """
    if not _SAFE_ID.fullmatch(video_id):
        raise ValueError(f"video id {video_id!r} may only contain A-Z a-z 0-9 _ -")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    subject = f"Video {video_id} ({redact_url(url)})"  # for messages; `url` fetches
    throttle = throttle or LocalThrottle(options.pauses)
    host = host_key(url)
    proxy = _next_proxy(options.proxies, host, throttle)
    try:
        throttle.before_starting(throttle_key(host, proxy))
    except HostPaused as exc:
        raise exc.about(subject) from exc
    throttle.sleep(_download_sleep(options))
    with throttle.download_slot(host, options.max_downloads_per_host):
        _remove_stale_work_dirs(dest_dir, video_id)
        work_dir = Path(tempfile.mkdtemp(prefix=f".{video_id}.download-", dir=dest_dir))
        try:
            fetch = functools.partial(
                _fetch, url, work_dir, options, progress, subject, throttle, proxy
            )
            info, produced = _politely(fetch, throttle)
            probe = _probe(produced, video_id, subject)
            _check_duration(info.get("duration") or probe.duration, options, subject)
            _check_filesize(probe.size_bytes, options, subject)
            final = dest_dir / f"{video_id}{produced.suffix.lower()}"
            os.replace(produced, final)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    logger.info("Downloaded %s to %s (%d bytes)", subject, final, probe.size_bytes)
    return DownloadedVideo(path=final, metadata=_metadata(info, probe, final))


def _download_sleep(options: DownloadOptions) -> float:
    """The random pause before a download (yt-dlp's sleep_interval / max_sleep_interval)."""
    low = options.sleep_interval_s
    return random.uniform(low, max(low, options.max_sleep_interval_s)) if low else 0.0


def _politely(call: Callable[[], Any], throttle: HostThrottle) -> Any:
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


def _next_proxy(proxies: tuple[str, ...], host: str, throttle: HostThrottle) -> str | None:
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


def _remove_stale_work_dirs(dest_dir: Path, video_id: str) -> None:
    """Work dirs of an earlier attempt killed mid-download (one lease holder per video)."""
    for stale in dest_dir.glob(f".{video_id}.download-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _fetch(
    url: str,
    work_dir: Path,
    options: DownloadOptions,
    progress: Callable[[DownloadProgress], None] | None,
    subject: str,
    throttle: HostThrottle,
    proxy: str | None,
) -> tuple[dict[str, Any], Path]:
    """Extract metadata once, check the rules, download with the same metadata; a stream URL
    refused mid-download (expired) is extracted again at once."""
    from yt_dlp.utils import YoutubeDLError

    ytdlp_log = _YtdlpLogger()
    hook = _ProgressForwarder(progress, options, subject)
    params = download_params(options, proxy) | {
        "logger": ytdlp_log,
        "paths": {"home": str(work_dir), "temp": str(work_dir)},
        "outtmpl": {"default": "video.%(ext)s"},
        "progress_hooks": [hook],
    }
    if options.cookies_file is not None:
        params["cookiefile"] = str(_private_cookies(options.cookies_file, work_dir))
    try:
        with _gated_ytdlp()(params, throttle=throttle, proxy=proxy) as ydl:
            for fresh in itertools.count():
                info = ydl.extract_info(url, download=False)
                _require_single_video(info, subject)
                check_download_rules(info, options, subject=subject)
                _require_disk_space(work_dir, _expected_size(info), options, subject)
                try:
                    # The second half of extract_info(download=True), on the same metadata: no
                    # second request. Private keys stay (e.g. which formats failed yt-dlp's test).
                    result = ydl.process_ie_result(info, download=True)
                    break
                except YoutubeDLError as exc:
                    hook.reraise_hook_error()
                    if fresh >= _FRESH_METADATA_TRIES or not _stream_url_refused(exc):
                        raise
                    logger.info(
                        "%s: the stream URL was refused (expired?): extracting it again", subject
                    )
    except HostPaused as exc:
        hook.reraise_hook_error()
        raise exc.about(subject) from exc
    except YoutubeDLError as exc:
        hook.reraise_hook_error()
        raise _classified(exc, subject, throttle, throttle_key(host_key(url), proxy)) from exc
    hook.reraise_hook_error()
    return info, _produced_file(result, work_dir, ytdlp_log, options, subject)


def _stream_url_refused(exc: BaseException) -> bool:
    """The media request was refused with 403: what YouTube answers for an expired stream URL."""
    return _http_status(list(_exception_chain(exc)), "") == 403


def _classified(
    exc: BaseException, subject: str, throttle: HostThrottle, key: str
) -> VideoDownloadError:
    """classify_ytdlp_error, with a throttle signal in the message (a bot check) pausing the host."""
    error = classify_ytdlp_error(exc, subject=subject)
    if isinstance(error, RetryableDownloadError) and error.signal is not None:
        return HostPaused(throttle.record_pause(key, error.signal), met=True, subject=subject)
    return error


@functools.cache
def _gated_ytdlp():
    """YoutubeDL whose every HTTP request (pages, APIs, media) takes its host's turn, waits out the
    host's pause, and pauses the host when the answer says stop."""
    from yt_dlp import YoutubeDL
    from yt_dlp.networking.exceptions import HTTPError

    class GatedYoutubeDL(YoutubeDL):
        def __init__(self, params: dict[str, Any], *, throttle: HostThrottle, proxy: str | None):
            super().__init__(params)
            self._throttle = throttle
            self._proxy = proxy

        def urlopen(self, req):
            url = getattr(req, "url", None) or getattr(req, "full_url", None) or str(req)
            with self._throttle.request_turn(throttle_key(host_key(url), self._proxy)) as turn:
                try:
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


def _private_cookies(cookies_file: Path, work_dir: Path) -> Path:
    """yt-dlp writes cookies back on exit: give it a copy so parallel runs never clobber the file."""
    if not Path(cookies_file).is_file():
        # A configuration error, not an outcome of this video: not a VideoDownloadError.
        raise FileNotFoundError(f"cookies file {cookies_file} (option cookies_file) does not exist")
    copy = work_dir / "cookies.txt"
    shutil.copyfile(cookies_file, copy)
    return copy


def _require_single_video(info: dict[str, Any] | None, subject: str) -> None:
    if not info:
        raise PermanentDownloadError(f"{subject}: yt-dlp found no video at this URL")
    if info.get("_type", "video") != "video":
        raise PermanentDownloadError(
            f"{subject} is a {info.get('_type')} (playlist or channel), not a single video"
        )
    if info.get("is_live") or info.get("live_status") in _UNFINISHED_LIVE:
        # It has no end: no size or duration cap could be checked before downloading it.
        raise DownloadBlocked(
            f"{subject} is blocked: it is a live stream; only finished videos are downloaded",
            rule="live",
        )


def _require_disk_space(
    work_dir: Path, expected: int | None, options: DownloadOptions, subject: str
) -> None:
    if options.min_free_disk_mb is None:
        return
    reserve = int(options.min_free_disk_mb * 1024 * 1024)
    purpose = (
        f"{subject}: its expected size ({(expected or 0) / 2**20:,.0f} MB) plus the "
        f"download.min_free_disk_mb reserve ({options.min_free_disk_mb:g} MB)"
    )
    require_free_space(work_dir, reserve + (expected or 0), purpose)


def _produced_file(result, work_dir, ytdlp_log, options, subject) -> Path:
    downloads = (result or {}).get("requested_downloads") or []
    paths = [Path(d["filepath"]) for d in downloads if d.get("filepath")]
    produced = [p for p in paths if p.is_file() and p.is_relative_to(work_dir)]
    if len(produced) == 1:
        return produced[0]
    if ytdlp_log.saw(_MAX_FILESIZE_ABORT):
        raise DownloadBlocked(
            f"{subject} is blocked: the server announced a size over the limit of "
            f"{options.max_filesize_mb:g} MB",
            rule="filesize",
        )
    if len(produced) > 1:
        names = ", ".join(p.name for p in produced)
        raise PermanentDownloadError(
            f"{subject}: yt-dlp produced {len(produced)} files ({names}); "
            "use a format that selects a single file"
        )
    raise RetryableDownloadError(
        f"{subject}: yt-dlp finished without an output file (unrecognised; last messages: "
        f"{ytdlp_log.tail()})"
    )


def _probe(path: Path, video_id: str, subject: str) -> VideoProbe:
    try:
        return probe_video(path, video_id=video_id)
    except VideoDecodeError as exc:
        raise PermanentDownloadError(
            f"{subject}: the downloaded file is not a usable video: {exc.reason}"
        ) from exc


def _metadata(info: dict[str, Any], probe: VideoProbe, final: Path) -> VideoMetadata:
    upload_date = info.get("upload_date")
    if isinstance(upload_date, str) and re.fullmatch(r"\d{8}", upload_date):
        upload_date = f"{upload_date[:4]}-{upload_date[4:6]}-{upload_date[6:]}"
    else:
        upload_date = None
    return VideoMetadata(
        title=info.get("title"),
        duration=_number(info.get("duration")) or probe.duration,
        fps=_number(info.get("fps")) or probe.fps,
        width=info.get("width") or probe.width,
        height=info.get("height") or probe.height,
        uploader=info.get("uploader") or info.get("channel"),
        upload_date=upload_date,
        tags=tuple(t for t in info.get("tags") or () if isinstance(t, str)),
        extractor=info.get("extractor"),
        webpage_url=info.get("webpage_url"),
        ext=final.suffix.lstrip("."),
        size_bytes=probe.size_bytes,
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value > 0 else None


# -- search ----------------------------------------------------------------------------------


def search_videos(
    query: str,
    max_results: int,
    *,
    options: DownloadOptions | None = None,
    throttle: HostThrottle | None = None,
) -> list[SearchHit]:
    """The first `max_results` YouTube videos for `query`. Errors raise; they are never ignored.
    Searches use the options' cookies, proxies and request pauses, and YouTube's throttle.

    yt-dlp's "ytsearchN:" sends YouTube's videos-only filter itself (EgIQAfABAQ==, type=video,
    as CAASAhAB in the reference system, whose `youtube:search_params` extractor argument yt-dlp
    does not read). Non-video entries are dropped by parse_search_results all the same.
    """
    if not query.strip():
        raise ValueError("search query is empty")
    if max_results < 1:
        raise ValueError(f"max_results must be at least 1, got {max_results}")
    options = options or DownloadOptions()
    throttle = throttle or LocalThrottle(options.pauses)
    proxy = _next_proxy(options.proxies, YOUTUBE, throttle)
    search = functools.partial(_search, query.strip(), max_results, options, throttle, proxy)
    return parse_search_results(_politely(search, throttle))


def _search(query, max_results, options, throttle, proxy) -> dict[str, Any] | None:
    from yt_dlp.utils import YoutubeDLError

    subject = f"YouTube search {query!r}"
    key = throttle_key(YOUTUBE, proxy)
    params = ytdlp_params(options, proxy) | {"skip_download": True}
    with tempfile.TemporaryDirectory(prefix="dataminer-search-") as scratch:
        if options.cookies_file is not None:
            params["cookiefile"] = str(_private_cookies(options.cookies_file, Path(scratch)))
        try:
            throttle.before_starting(key)
            with _gated_ytdlp()(params, throttle=throttle, proxy=proxy) as ydl:
                return ydl.extract_info(f"ytsearch{max_results}:{query}", download=False)
        except HostPaused as exc:
            raise exc.about(subject) from exc
        except YoutubeDLError as exc:
            raise _classified(exc, subject, throttle, key) from exc


def parse_search_results(info: dict[str, Any] | None) -> list[SearchHit]:
    """Video hits from a flat yt-dlp search result, in order, without duplicates.

    Entries that are not videos (channels, playlists: their ids are not 11 characters) are left out.
    """
    hits: list[SearchHit] = []
    seen: set[str] = set()
    for entry in (info or {}).get("entries") or ():
        video_id = (entry or {}).get("id")
        if not isinstance(video_id, str) or not YOUTUBE_ID.fullmatch(video_id) or video_id in seen:
            continue
        if entry.get("ie_key") not in (None, "Youtube"):
            continue
        seen.add(video_id)
        hits.append(
            SearchHit(
                video_id=video_id,
                url=youtube_watch_url(video_id),
                title=entry.get("title"),
                duration=_number(entry.get("duration")),
            )
        )
    return hits


# -- yt-dlp errors ---------------------------------------------------------------------------

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
# once, `_fetch`); a later attempt can work.
_RETRYABLE_4XX = frozenset({403, 408, 425, 429})


def classify_ytdlp_error(exc: BaseException, *, subject: str) -> VideoDownloadError:
    """Map a yt-dlp exception (and its causes) to Permanent/Retryable, with a readable reason.
    An error that says the host throttles us (a bot check, 429, 503) carries its `signal`."""
    chain = list(_exception_chain(exc))
    messages = [_clean_message(e) for e in chain]
    text = _summary(messages)
    lowered = " | ".join(messages).lower()
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


# -- yt-dlp logging and progress -------------------------------------------------------------


class _YtdlpLogger:
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


class _ProgressForwarder:
    """A yt-dlp progress hook that stops a download growing past the size cap, forwards to the
    caller's callback and remembers its errors.

    yt-dlp's own max_filesize only acts on a size the server announces; a body without a
    Content-Length (a live or generated response) would otherwise be read to its end, if any."""

    def __init__(
        self,
        callback: Callable[[DownloadProgress], None] | None,
        options: DownloadOptions,
        subject: str,
    ):
        self._callback = callback
        self._options = options
        self._max_bytes = _max_bytes(options)
        self._subject = subject
        self._error: BaseException | None = None

    def __call__(self, status: dict[str, Any]) -> None:
        if status.get("status") not in ("downloading", "finished"):
            return
        try:
            downloaded = status.get("downloaded_bytes") or 0
            if self._max_bytes is not None and downloaded > self._max_bytes:
                raise DownloadBlocked(
                    f"{self._subject} is blocked: it grew over the limit of "
                    f"{self._options.max_filesize_mb:g} MB while downloading (its size was not "
                    "announced); the download was stopped there",
                    rule="filesize",
                )
            if self._callback is None:
                return
            self._callback(
                DownloadProgress(
                    status=status["status"],
                    downloaded_bytes=status.get("downloaded_bytes"),
                    total_bytes=status.get("total_bytes") or status.get("total_bytes_estimate"),
                    speed=status.get("speed"),
                    eta=status.get("eta"),
                )
            )
        except BaseException as exc:
            self._error = exc
            raise

    def reraise_hook_error(self) -> None:
        if self._error is not None:
            raise self._error
