"""The download client: searching for videos and downloading one, behind a small interface.

`YtDlpClient` is the real thing (yt-dlp's Python API, `acquisition.ytdlp`). Tests replace search
results, which need YouTube, with canned ones and keep the real downloads against a local HTTP
server.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from dataminer_dagster.acquisition.ytdlp import (
    DownloadedVideo,
    DownloadOptions,
    DownloadProgress,
    SearchHit,
)


class DownloadClient(dg.ConfigurableResource):
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


class YtDlpClient(DownloadClient):
    """YouTube search and downloads of any URL yt-dlp supports."""

    def search(self, query: str, max_results: int) -> list[SearchHit]:
        from dataminer_dagster.acquisition.ytdlp import search_videos

        return search_videos(query, max_results)

    def download(self, url, video_id, dest_dir, options, progress=None) -> DownloadedVideo:
        from dataminer_dagster.acquisition.ytdlp import download_video

        return download_video(url, video_id, dest_dir, options, progress=progress)
