"""Searching YouTube with yt-dlp: the first videos for a query, as `SearchHit`s.

A search takes YouTube's turn at the host throttle (`throttled_ytdlp`) like a download does.
yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.acquisition.politeness import HostThrottle, LocalThrottle, throttle_key
from dataminer_dagster.acquisition.throttled_ytdlp import (
    classified,
    gated_ytdlp,
    next_proxy,
    politely,
)
from dataminer_dagster.acquisition.video_ids import YOUTUBE_ID, youtube_watch_url
from dataminer_dagster.acquisition.ytdlp_params import (
    DownloadOptions,
    positive_number,
    private_cookies,
    ytdlp_params,
)

YOUTUBE = "youtube.com"  # the host key of searches


@dataclass(frozen=True)
class SearchHit:
    video_id: str
    url: str
    title: str | None
    duration: float | None


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
    proxy = next_proxy(options.proxies, YOUTUBE, throttle)
    search = functools.partial(_search, query.strip(), max_results, options, throttle, proxy)
    return parse_search_results(politely(search, throttle))


def _search(query, max_results, options, throttle, proxy) -> dict[str, Any] | None:
    from yt_dlp.utils import YoutubeDLError

    subject = f"YouTube search {query!r}"
    key = throttle_key(YOUTUBE, proxy)
    params = ytdlp_params(options, proxy) | {"skip_download": True}
    with tempfile.TemporaryDirectory(prefix="dataminer-search-") as scratch:
        if options.cookies_file is not None:
            params["cookiefile"] = str(private_cookies(options.cookies_file, Path(scratch)))
        try:
            throttle.before_starting(key)
            with gated_ytdlp()(params, throttle=throttle, proxy=proxy) as ydl:
                return ydl.extract_info(f"ytsearch{max_results}:{query}", download=False)
        except HostPaused as exc:
            raise exc.about(subject) from exc
        except YoutubeDLError as exc:
            raise classified(exc, subject, throttle, key) from exc


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
                duration=positive_number(entry.get("duration")),
            )
        )
    return hits
