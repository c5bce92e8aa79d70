"""Finding videos with yt-dlp, as `SearchHit`s: the first videos of a YouTube search, and the
newest entries of a listing (an RSS/Atom feed, a YouTube channel or playlist).

A search or a listing takes its host's turn at the host throttle (`throttled_ytdlp`) like a
download does. Both are flat extractions: the videos are named, never resolved one by one.
yt-dlp is imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.acquisition.politeness import (
    HostThrottle,
    LocalThrottle,
    host_key,
    throttle_key,
)
from dataminer_dagster.acquisition.throttled_ytdlp import next_proxy, politely, ytdlp_session
from dataminer_dagster.acquisition.video_ids import (
    YOUTUBE_ID,
    is_youtube_url,
    video_id_for_url,
    youtube_watch_url,
)
from dataminer_dagster.acquisition.ytdlp_params import (
    YtDlpOptions,
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
    options: YtDlpOptions,
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
    options = options.for_host(YOUTUBE)
    throttle = throttle or LocalThrottle(options.pauses)
    proxy = next_proxy(options.proxies, YOUTUBE, throttle)
    search = functools.partial(_search, query.strip(), max_results, options, throttle, proxy)
    return parse_search_results(politely(search, throttle))


def list_videos(
    url: str,
    max_entries: int,
    *,
    options: YtDlpOptions,
    throttle: HostThrottle | None = None,
) -> list[SearchHit]:
    """The newest `max_entries` videos a listing names (a feed's items in its order, a channel's
    or playlist's first entries: newest first on YouTube). Errors raise; they are never ignored.
    Entries without a usable video URL are left out."""
    if max_entries < 1:
        raise ValueError(f"max_entries must be at least 1, got {max_entries}")
    host = host_key(url)
    options = options.for_host(host)
    throttle = throttle or LocalThrottle(options.pauses)
    proxy = next_proxy(options.proxies, host, throttle)
    listing = functools.partial(
        _extract,
        url,
        f"listing {url}",
        host,
        {"noplaylist": False, "playlistend": max_entries},
        options,
        throttle,
        proxy,
    )
    return parse_listing(politely(listing, throttle))[:max_entries]


def _search(query, max_results, options, throttle, proxy) -> dict[str, Any] | None:
    return _extract(
        f"ytsearch{max_results}:{query}",
        f"YouTube search {query!r}",
        YOUTUBE,
        {},
        options,
        throttle,
        proxy,
    )


def _extract(target, subject, host, extra, options, throttle, proxy) -> dict[str, Any] | None:
    params = ytdlp_params(options, proxy) | {"skip_download": True} | extra
    with tempfile.TemporaryDirectory(prefix="dataminer-search-") as scratch:
        if options.cookies_file is not None:
            params["cookiefile"] = str(private_cookies(options.cookies_file, Path(scratch)))
        try:
            throttle.before_starting(throttle_key(host, proxy))
        except HostPaused as exc:
            raise exc.about(subject) from exc
        with ytdlp_session(
            params,
            subject=subject,
            host=host,
            throttle=throttle,
            proxy=proxy,
            allow_private_networks=options.allow_private_networks,
        ) as ydl:
            return ydl.extract_info(target, download=False)


def parse_listing(info: dict[str, Any] | None) -> list[SearchHit]:
    """The videos of a flat yt-dlp listing, in its order, without duplicates: YouTube entries by
    their id, others (a feed's links) by their URL. A single video (a URL that is not a listing)
    is a listing of one."""
    if info is not None and info.get("_type", "video") == "video":
        info = {"entries": [info | {"url": info.get("webpage_url") or info.get("url")}]}
    hits: list[SearchHit] = []
    seen: set[str] = set()
    for entry in (info or {}).get("entries") or ():
        hit = _listed_video(entry or {})
        if hit is not None and hit.video_id not in seen:
            seen.add(hit.video_id)
            hits.append(hit)
    return hits


def _listed_video(entry: dict[str, Any]) -> SearchHit | None:
    from yt_dlp.utils import unsmuggle_url

    if entry.get("_type") == "playlist":  # a channel's tab or a nested playlist: not walked
        return None
    url = unsmuggle_url(entry.get("url") or entry.get("webpage_url") or "")[0]
    video_id = entry.get("id")
    if (
        entry.get("ie_key") == "Youtube"
        and isinstance(video_id, str)
        and YOUTUBE_ID.fullmatch(video_id)
    ):
        url = youtube_watch_url(video_id)
    try:
        video_id = video_id_for_url(url)
    except ValueError:
        return None
    if is_youtube_url(url):
        url = youtube_watch_url(video_id)
    return SearchHit(video_id, url, entry.get("title"), positive_number(entry.get("duration")))


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
