"""Where videos come from: searching and downloading, behind a small interface.

`YtDlpSources` is the real thing (yt-dlp's Python API). Tests replace search results, which need
YouTube, with canned ones and keep the real downloads against a local HTTP server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from dataminer_dagster.downloading import (
    DownloadedVideo,
    DownloadOptions,
    DownloadProgress,
    SearchHit,
)


class VideoSources(dg.ConfigurableResource):
    """Interface: search for videos and download one."""

    def search(self, query: str, max_results: int) -> list[SearchHit]:
        raise NotImplementedError

    def download(
        self,
        url: str,
        video_id: str,
        dest_dir: Path,
        options: DownloadOptions,
        progress: Callable[[DownloadProgress], None] | None = None,
    ) -> DownloadedVideo:
        raise NotImplementedError


class YtDlpSources(VideoSources):
    """YouTube search and downloads of any URL yt-dlp supports."""

    def search(self, query: str, max_results: int) -> list[SearchHit]:
        from dataminer_dagster.downloading import search_videos

        return search_videos(query, max_results)

    def download(self, url, video_id, dest_dir, options, progress=None) -> DownloadedVideo:
        from dataminer_dagster.downloading import download_video

        return download_video(url, video_id, dest_dir, options, progress=progress)
