"""The download stage's config (`download:` in the project YAML)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from dataminer_dagster.core.config_section import Section


class DownloadConfig(Section):
    max_height: int | None = Field(
        720, ge=144, description="Height cap of the downloaded video stream."
    )
    format: str | None = Field(
        None,
        description="Explicit yt-dlp format; default: one video-only stream under max_height (no ffmpeg needed).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Network timeout of one request.")
    min_speed_kb_s: float = Field(
        16,
        ge=0,
        description="A download that moves fewer KB per second than this over min_speed_window_s is given up "
        "(a failed attempt, retried with back-off); 0: no minimum.",
    )
    min_speed_window_s: float = Field(
        60, gt=0, description="The window over which a download's speed is measured."
    )
    max_download_s: float = Field(
        3600,
        gt=0,
        description="Longest one download may take, from its first request; past it, it is given up (a failed attempt).",
    )
    blocked_hashtags: list[str] = Field(
        default_factory=list,
        description="Skip videos carrying one of these tags (whole-tag match, case-insensitive, leading # optional).",
    )
    blocked_hashtags_file: Path | None = Field(
        None,
        description="File with more blocked tags, one per line, read when the config is loaded (relative: to the config file); "
        "blank lines and lines starting with '# ' (hash, space) or // are comments, '#tag' and 'tag' both block tag.",
    )
    max_duration_s: float = Field(7200, gt=0, description="Skip longer videos.")
    max_filesize_mb: float = Field(
        4096,
        gt=0,
        description="Skip larger files; a download without an announced size stops once past it.",
    )
    min_free_disk_mb: float = Field(
        1024,
        ge=0,
        description="Free space a download leaves on the data disk besides the video's expected size; else it waits.",
    )
    cookies_file: Path | None = Field(
        None, description="Netscape cookies file handed to yt-dlp, for searches and downloads."
    )
    sleep_interval_s: float | None = Field(
        None,
        ge=0,
        description="Least random pause before each download of a run (yt-dlp's sleep_interval); "
        "default: 10 for YouTube (yt-dlp's `-t sleep` preset), 0 for other hosts.",
    )
    max_sleep_interval_s: float | None = Field(
        None,
        ge=0,
        description="Most random pause before each download (yt-dlp's max_sleep_interval); "
        "default: 20 for YouTube, 0 for other hosts; never below sleep_interval_s.",
    )
    sleep_requests_s: float | None = Field(
        None,
        ge=0,
        description="Pause between the requests of one search or extraction (yt-dlp's sleep_interval_requests); "
        "default: 0.75 for YouTube, 0 for other hosts.",
    )
    rate_limit: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)?[KMG]?$",
        description="Most bytes per second of one download, as yt-dlp writes it (500K, 4.2M); default unlimited.",
    )
    max_downloads_per_host: int = Field(
        2,
        ge=1,
        description="Downloads from one host at once, across every run and project (the smallest value of a video's projects counts).",
    )
    proxies: list[str] = Field(
        default_factory=list,
        description="Proxies (http://, https://, socks5://) used in turn, one per download or search; "
        "a proxy the host paused is skipped while another is free.",
    )
    pause_base_s: float = Field(
        60.0,
        gt=0,
        description="How long a host that says stop (429, 503, a bot check) without a Retry-After is paused for every run; "
        "doubles with each pause in a row, times a random 0.5-1 (a Retry-After is honoured as given).",
    )
    pause_max_s: float = Field(3600.0, gt=0, description="Longest pause of a host.")
    max_pause_wait_s: float = Field(
        120.0,
        ge=0,
        description="A run waits in place for a host's pause this short; for a longer one it gives its items back "
        "(no attempt used) until the pause ends.",
    )

    @model_validator(mode="after")
    def _pauses_in_order(self) -> DownloadConfig:
        if self.pause_max_s < self.pause_base_s:
            raise ValueError("download.pause_max_s must be at least download.pause_base_s")
        return self

    def rate_limit_bytes(self) -> int | None:
        if self.rate_limit is None:
            return None
        factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(self.rate_limit[-1], 1)
        return int(float(self.rate_limit.rstrip("KMG")) * factor)
