"""The download client: searching for videos, listing a feed or channel, and downloading one,
behind a small interface.

`YtDlpClient` is the real thing (yt-dlp's Python API, `acquisition.ytdlp_search` and
`assets.download.fetch`). Tests replace search results, which need YouTube, with canned ones
and keep the real downloads against a local HTTP server. Both calls take the project's options
(cookies, proxies, politeness) and the host throttle that every run shares
(`DatabaseResource.host_throttle`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from dataminer_dagster.acquisition.politeness import HostThrottle
from dataminer_dagster.acquisition.ytdlp_search import SearchHit
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.assets.download.fetch import DownloadedVideo, DownloadProgress


class DownloadClient(dg.ConfigurableResource):
    """Interface: search for videos, list a feed's or channel's newest videos, download one. All
    raise the outcomes of `acquisition.errors`; HostPaused when the host said stop for longer
    than the throttle waits."""

    def search(
        self,
        query: str,
        max_results: int,
        options: DownloadConfig | None = None,
        throttle: HostThrottle | None = None,
    ) -> list[SearchHit]:
        raise NotImplementedError

    def list_videos(
        self,
        url: str,
        max_entries: int,
        options: DownloadConfig | None = None,
        throttle: HostThrottle | None = None,
    ) -> list[SearchHit]:
        raise NotImplementedError

    def download(
        self,
        url: str,
        video_id: str,
        dest_dir: Path,
        options: DownloadConfig,
        progress: Callable[[DownloadProgress], None] | None = None,
        throttle: HostThrottle | None = None,
    ) -> DownloadedVideo:
        raise NotImplementedError


class YtDlpClient(DownloadClient):
    """YouTube search, and listings and downloads of any URL yt-dlp supports."""

    def search(self, query, max_results, options=None, throttle=None) -> list[SearchHit]:
        from dataminer_dagster.acquisition.ytdlp_search import search_videos

        return search_videos(query, max_results, options=options, throttle=throttle)

    def list_videos(self, url, max_entries, options=None, throttle=None) -> list[SearchHit]:
        from dataminer_dagster.acquisition.ytdlp_search import list_videos

        return list_videos(url, max_entries, options=options, throttle=throttle)

    def download(
        self, url, video_id, dest_dir, options, progress=None, throttle=None
    ) -> DownloadedVideo:
        from dataminer_dagster.assets.download.fetch import download_video

        return download_video(
            url, video_id, dest_dir, options, progress=progress, throttle=throttle
        )
