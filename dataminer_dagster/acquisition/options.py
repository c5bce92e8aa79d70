"""A download's options from the projects it serves: one download of a video serves every project
linked to it, so their settings are merged into one `DownloadOptions`."""

from __future__ import annotations

from collections.abc import Sequence

from dataminer_dagster.acquisition.politeness import PausePolicy, default_sleeps
from dataminer_dagster.acquisition.ytdlp_params import DownloadOptions
from dataminer_dagster.assets.download.config import DownloadConfig


def merged_download_options(configs: Sequence[DownloadConfig], host: str) -> DownloadOptions:
    """The options of one download (or search) from `host` for these projects: the most
    permissive of their rules (rules that only some projects have are applied per project
    afterwards) and of their patience with a slow download, but the largest reserve of free disk
    space and the politest pace (the longest sleeps and pauses, the lowest limits). Sleeps a
    project leaves unset are the host's defaults."""

    def loosest(values):
        return None if any(v is None for v in values) else max(values)

    blocked = set.intersection(
        *({t.lstrip("#").casefold() for t in c.blocked_hashtags} for c in configs)
    )
    paces = [_pace(c, host) for c in configs]
    rates = [c.rate_limit_bytes() for c in configs if c.rate_limit is not None]
    return DownloadOptions(
        max_height=loosest([c.max_height for c in configs]),
        format=next((c.format for c in configs if c.format), None),
        socket_timeout=max(c.timeout_s for c in configs),
        min_speed_bytes_s=min(c.min_speed_kb_s for c in configs) * 1024 or None,
        min_speed_window_s=max(c.min_speed_window_s for c in configs),
        max_download_s=max(c.max_download_s for c in configs),
        blocked_hashtags=tuple(sorted(blocked)),
        max_duration_s=loosest([c.max_duration_s for c in configs]),
        max_filesize_mb=loosest([c.max_filesize_mb for c in configs]),
        min_free_disk_mb=max(c.min_free_disk_mb for c in configs),
        cookies_file=next((c.cookies_file for c in configs if c.cookies_file), None),
        sleep_interval_s=max(p[0] for p in paces),
        max_sleep_interval_s=max(p[1] for p in paces),
        sleep_requests_s=max(p[2] for p in paces),
        rate_limit_bytes=min(rates) if rates else None,
        max_downloads_per_host=min(c.max_downloads_per_host for c in configs),
        proxies=tuple(next((c.proxies for c in configs if c.proxies), ())),
        pauses=PausePolicy(
            base_s=max(c.pause_base_s for c in configs), max_s=max(c.pause_max_s for c in configs)
        ),
        max_pause_wait_s=max(c.max_pause_wait_s for c in configs),
    )


def _pace(config: DownloadConfig, host: str) -> tuple[float, float, float]:
    """(least sleep before a download, most, sleep between requests) of one project."""
    site = default_sleeps(host)
    low = site.before_download_s if config.sleep_interval_s is None else config.sleep_interval_s
    high = (
        site.before_download_max_s
        if config.max_sleep_interval_s is None
        else config.max_sleep_interval_s
    )
    between = (
        site.between_requests_s if config.sleep_requests_s is None else config.sleep_requests_s
    )
    return low, max(low, high), between
