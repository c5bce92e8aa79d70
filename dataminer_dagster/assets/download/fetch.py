"""Downloading one video with yt-dlp (its Python API; no ffmpeg binary needed).

One metadata extraction per video: the rules (`rules.py`) are checked on that metadata, and
the download reuses it. Files are written into a private work directory inside `dest_dir` and
moved into place (`<dest_dir>/<video_id>.<ext>`) only once they probe as a video, so a failure
never leaves a partial file behind. The download stage passes a staging folder of its own as
`dest_dir` and publishes the video in its completion, which checks its lease. yt-dlp errors are
sorted into the outcomes of `acquisition.errors` (`ytdlp_errors`), which the caller turns into
claim-table states. Requests go through the host throttle (`throttled_ytdlp`); a stream URL
refused mid-download (expired) is fetched again at once with fresh metadata. A transfer slower
than the minimum speed, or past the download's deadline, is given up (`pace.py`).

yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataminer_dagster.acquisition.errors import (
    DownloadBlocked,
    HostPaused,
    PermanentDownloadError,
    RetryableDownloadError,
)
from dataminer_dagster.acquisition.politeness import (
    HostThrottle,
    LocalThrottle,
    host_key,
    throttle_key,
)
from dataminer_dagster.acquisition.throttled_ytdlp import next_proxy, politely, ytdlp_session
from dataminer_dagster.acquisition.ytdlp_errors import stream_url_refused
from dataminer_dagster.acquisition.ytdlp_params import (
    YtdlpLogger,
    download_params,
    max_filesize_bytes,
    positive_number,
    private_cookies,
)
from dataminer_dagster.assets.download.pace import DownloadPace
from dataminer_dagster.assets.download.rules import (
    check_download_rules,
    check_duration,
    check_filesize,
    expected_size,
)
from dataminer_dagster.core.files import require_free_space
from dataminer_dagster.core.media import VideoDecodeError, VideoProbe, probe_video
from dataminer_dagster.core.redact import redact_url

if TYPE_CHECKING:
    from dataminer_dagster.assets.download.config import DownloadConfig

logger = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9_-]+")
_MAX_FILESIZE_ABORT = "larger than max-filesize"
_UNFINISHED_LIVE = frozenset({"is_live", "post_live"})  # yt-dlp's live_status values
# A stream URL refused mid-download (expired) is fetched again with fresh metadata this often.
_FRESH_METADATA_TRIES = 2


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
    eta: float | None  # seconds


def download_video(
    url: str,
    video_id: str,
    dest_dir: Path,
    options: DownloadConfig,
    *,
    progress: Callable[[DownloadProgress], None] | None = None,
    throttle: HostThrottle | None = None,
) -> DownloadedVideo:
    """Download `url` to `dest_dir/<video_id>.<ext>` or raise one of the VideoDownloadErrors.
    `dest_dir` is the caller's own (the download stage's staging folder): what a download killed
    mid-way leaves in it goes with it.

    `throttle` shares the host's pauses, request turns and download slots with other runs; without
    one, pauses are kept in this call only and never waited for (HostPaused at once).
    An exception raised by `progress` (e.g. "lease lost") aborts the download and propagates as is.
    """
    if not _SAFE_ID.fullmatch(video_id):
        raise ValueError(f"video id {video_id!r} may only contain A-Z a-z 0-9 _ -")
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    subject = f"Video {video_id} ({redact_url(url)})"  # for messages; `url` fetches
    host = host_key(url)
    options = options.for_host(host)
    throttle = throttle or LocalThrottle(options.pauses)
    proxy = next_proxy(options.proxies, host, throttle)
    try:
        throttle.before_starting(throttle_key(host, proxy))
    except HostPaused as exc:
        raise exc.about(subject) from exc
    throttle.sleep(_download_sleep(options))
    with throttle.download_slot(host, options.max_downloads_per_host):
        work_dir = Path(tempfile.mkdtemp(prefix=f".{video_id}.download-", dir=dest_dir))
        try:
            fetch = functools.partial(
                _fetch, url, work_dir, options, progress, subject, throttle, proxy
            )
            info, produced = politely(fetch, throttle)
            probe = _probe(produced, video_id, subject)
            check_duration(info.get("duration") or probe.duration, options, subject)
            check_filesize(probe.size_bytes, options, subject)
            final = dest_dir / f"{video_id}{produced.suffix.lower()}"
            os.replace(produced, final)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)
    logger.info("Downloaded %s to %s (%d bytes)", subject, final, probe.size_bytes)
    return DownloadedVideo(path=final, metadata=_metadata(info, probe, final))


def _download_sleep(options: DownloadConfig) -> float:
    """The random pause before a download (yt-dlp's sleep_interval / max_sleep_interval)."""
    low = options.sleep_interval_s
    return random.uniform(low, max(low, options.max_sleep_interval_s)) if low else 0.0


def _fetch(
    url: str,
    work_dir: Path,
    options: DownloadConfig,
    progress: Callable[[DownloadProgress], None] | None,
    subject: str,
    throttle: HostThrottle,
    proxy: str | None,
) -> tuple[dict[str, Any], Path]:
    """Extract metadata once, check the rules, download with the same metadata; a stream URL
    refused mid-download (expired) is extracted again at once."""
    from yt_dlp.utils import YoutubeDLError

    ytdlp_log = YtdlpLogger()
    hook = _ProgressForwarder(progress, options, subject)
    params = download_params(options, proxy) | {
        "logger": ytdlp_log,
        "paths": {"home": str(work_dir), "temp": str(work_dir)},
        "outtmpl": {"default": "video.%(ext)s"},
        "progress_hooks": [hook],
    }
    if options.cookies_file is not None:
        params["cookiefile"] = str(private_cookies(options.cookies_file, work_dir))
    with ytdlp_session(
        params,
        subject=subject,
        host=host_key(url),
        throttle=throttle,
        proxy=proxy,
        allow_private_networks=options.allow_private_networks,
        before_classifying=hook.reraise_hook_error,
    ) as ydl:
        for fresh in itertools.count():
            info = ydl.extract_info(url, download=False)
            _require_single_video(info, subject)
            check_download_rules(info, options, subject=subject)
            _require_disk_space(work_dir, expected_size(info), options, subject)
            try:
                # The second half of extract_info(download=True), on the same metadata: no
                # second request. Private keys stay (e.g. which formats failed yt-dlp's test).
                result = ydl.process_ie_result(info, download=True)
                break
            except YoutubeDLError as exc:
                hook.reraise_hook_error()
                if fresh >= _FRESH_METADATA_TRIES or not stream_url_refused(exc):
                    raise
                logger.info(
                    "%s: the stream URL was refused (expired?): extracting it again", subject
                )
    hook.reraise_hook_error()
    return info, _produced_file(result, work_dir, ytdlp_log, options, subject)


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
    work_dir: Path, expected: int | None, options: DownloadConfig, subject: str
) -> None:
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
        duration=positive_number(info.get("duration")) or probe.duration,
        fps=positive_number(info.get("fps")) or probe.fps,
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


class _ProgressForwarder:
    """A yt-dlp progress hook that stops a download growing past the size cap or going too slowly
    (`DownloadPace`), forwards to the caller's callback and remembers its errors.

    yt-dlp's own max_filesize only acts on a size the server announces; a body without a
    Content-Length (a live or generated response) would otherwise be read to its end, if any."""

    def __init__(
        self,
        callback: Callable[[DownloadProgress], None] | None,
        options: DownloadConfig,
        subject: str,
    ):
        self._callback = callback
        self._options = options
        self._max_bytes = max_filesize_bytes(options)
        self._pace = DownloadPace(options, subject)
        self._subject = subject
        self._error: BaseException | None = None

    def __call__(self, status: dict[str, Any]) -> None:
        if status.get("status") not in ("downloading", "finished"):
            return
        try:
            downloaded = status.get("downloaded_bytes") or 0
            if downloaded > self._max_bytes:
                raise DownloadBlocked(
                    f"{self._subject} is blocked: it grew over the limit of "
                    f"{self._options.max_filesize_mb:g} MB while downloading (its size was not "
                    "announced); the download was stopped there",
                    rule="filesize",
                )
            if status["status"] == "downloading":
                self._pace.check(downloaded)
            if self._callback is None:
                return
            self._callback(
                DownloadProgress(
                    status=status["status"],
                    downloaded_bytes=status.get("downloaded_bytes"),
                    total_bytes=status.get("total_bytes") or status.get("total_bytes_estimate"),
                    eta=status.get("eta"),
                )
            )
        except BaseException as exc:
            self._error = exc
            raise

    def reraise_hook_error(self) -> None:
        if self._error is not None:
            raise self._error
