"""The download stage's config (`download:` in the project YAML), which is also the options of
one download: one download of a video serves every project linked to it, so their sections are
merged into one `DownloadConfig` (`DownloadConfig.merged`), each key by the rule it declares
beside its type. A new key is one field here with its merge rule, plus the code that uses it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from dataminer_dagster.acquisition.politeness import PausePolicy, default_sleeps
from dataminer_dagster.core.config_section import Section


@dataclass(frozen=True)
class MergeRule:
    """How the values of one key in the projects sharing a download become the download's."""

    combine: Callable[[list[Any]], Any]


def _loosest(values: list[Any]) -> Any:
    return None if any(v is None for v in values) else max(values)


def _common_tags(values: list[list[str]]) -> list[str]:
    return sorted(set.intersection(*({t.lstrip("#").casefold() for t in tags} for tags in values)))


def _slowest_rate(values: list[str | None]) -> str | None:
    return min((v for v in values if v is not None), key=_rate_bytes, default=None)


# The most permissive of the projects' rules (rules that only some projects have are applied per
# project after the download) and of their patience with a slow download, but the largest reserve
# of free disk space and the politest pace (the longest sleeps and pauses, the lowest limits).
LARGEST = MergeRule(max)
SMALLEST = MergeRule(min)
LOOSEST = MergeRule(_loosest)  # None (no limit) if any project sets none, else the largest
FIRST_SET = MergeRule(lambda values: next((v for v in values if v), values[0]))
COMMON_TAGS = MergeRule(_common_tags)  # tags every project blocks
SLOWEST_RATE = MergeRule(_slowest_rate)


class DownloadConfig(Section):
    max_height: Annotated[int | None, LOOSEST] = Field(
        720, ge=144, description="Height cap of the downloaded video stream."
    )
    format: Annotated[str | None, FIRST_SET] = Field(
        None,
        description="Explicit yt-dlp format; default: one video-only stream under max_height (no ffmpeg needed).",
    )
    timeout_s: Annotated[float, LARGEST] = Field(
        30.0, gt=0, description="Network timeout of one request."
    )
    min_speed_kb_s: Annotated[float, SMALLEST] = Field(
        16,
        ge=0,
        description="A download that moves fewer KB per second than this over min_speed_window_s is given up "
        "(a failed attempt, retried with back-off); 0: no minimum.",
    )
    min_speed_window_s: Annotated[float, LARGEST] = Field(
        60, gt=0, description="The window over which a download's speed is measured."
    )
    max_download_s: Annotated[float, LARGEST] = Field(
        3600,
        gt=0,
        description="Longest one download may take, from its first request; past it, it is given up (a failed attempt).",
    )
    blocked_hashtags: Annotated[list[str], COMMON_TAGS] = Field(
        default_factory=list,
        description="Skip videos carrying one of these tags (whole-tag match, case-insensitive, leading # optional).",
    )
    blocked_hashtags_file: Annotated[Path | None, FIRST_SET] = Field(
        None,
        description="File with more blocked tags, one per line, read when the config is loaded (relative: to the config file); "
        "blank lines and lines starting with '# ' (hash, space) or // are comments, '#tag' and 'tag' both block tag.",
    )
    max_duration_s: Annotated[float, LARGEST] = Field(7200, gt=0, description="Skip longer videos.")
    max_filesize_mb: Annotated[float, LARGEST] = Field(
        4096,
        gt=0,
        description="Skip larger files; a download without an announced size stops once past it.",
    )
    min_free_disk_mb: Annotated[float, LARGEST] = Field(
        1024,
        ge=0,
        description="Free space a download leaves on the data disk besides the video's expected size; else it waits.",
    )
    cookies_file: Annotated[Path | None, FIRST_SET] = Field(
        None, description="Netscape cookies file handed to yt-dlp, for searches and downloads."
    )
    sleep_interval_s: Annotated[float | None, LARGEST] = Field(
        None,
        ge=0,
        description="Least random pause before each download of a run (yt-dlp's sleep_interval); "
        "default: 10 for YouTube (yt-dlp's `-t sleep` preset), 0 for other hosts.",
    )
    max_sleep_interval_s: Annotated[float | None, LARGEST] = Field(
        None,
        ge=0,
        description="Most random pause before each download (yt-dlp's max_sleep_interval); "
        "default: 20 for YouTube, 0 for other hosts; never below sleep_interval_s.",
    )
    sleep_requests_s: Annotated[float | None, LARGEST] = Field(
        None,
        ge=0,
        description="Pause between the requests of one search or extraction (yt-dlp's sleep_interval_requests); "
        "default: 0.75 for YouTube, 0 for other hosts.",
    )
    rate_limit: Annotated[str | None, SLOWEST_RATE] = Field(
        None,
        pattern=r"^\d+(\.\d+)?[KMG]?$",
        description="Most bytes per second of one download, as yt-dlp writes it (500K, 4.2M); default unlimited.",
    )
    max_downloads_per_host: Annotated[int, SMALLEST] = Field(
        2,
        ge=1,
        description="Downloads from one host at once, across every run and project (the smallest value of a video's projects counts).",
    )
    proxies: Annotated[list[str], FIRST_SET] = Field(
        default_factory=list,
        description="Proxies (http://, https://, socks5://) used in turn, one per download or search; "
        "a proxy the host paused is skipped while another is free.",
    )
    pause_base_s: Annotated[float, LARGEST] = Field(
        60.0,
        gt=0,
        description="How long a host that says stop (429, 503, a bot check) without a Retry-After is paused for every run; "
        "doubles with each pause in a row, times a random 0.5-1 (a Retry-After is honoured as given).",
    )
    pause_max_s: Annotated[float, LARGEST] = Field(
        3600.0, gt=0, description="Longest pause of a host."
    )
    max_pause_wait_s: Annotated[float, LARGEST] = Field(
        120.0,
        ge=0,
        description="A run waits in place for a host's pause this short; for a longer one it gives its items back "
        "(no attempt used) until the pause ends.",
    )

    allow_private_networks: Annotated[bool, SMALLEST] = Field(
        False,
        description="Fetch from loopback and private network addresses (127.0.0.1, 10.x, "
        "192.168.x, ...): refused unless set, as a config from someone else could reach the "
        "local network; link-local and cloud metadata addresses are refused always "
        "(docs/input-safety.md). A video of several projects is fetched from such an address "
        "only when all of them allow it.",
    )
    retries: Annotated[int, LARGEST] = Field(
        3,
        ge=0,
        le=100,
        description="yt-dlp's own retries of one request, fragment or extraction before the download attempt fails.",
    )

    @model_validator(mode="after")
    def _pauses_in_order(self) -> DownloadConfig:
        if self.pause_max_s < self.pause_base_s:
            raise ValueError("download.pause_max_s must be at least download.pause_base_s")
        return self

    @classmethod
    def merged(cls, configs: Sequence[DownloadConfig], host: str) -> DownloadConfig:
        """The settings of one download (or search) from `host` for the projects of `configs`,
        each key by its merge rule, the sleeps a project leaves unset being the host's."""
        resolved = [config.for_host(host) for config in configs]
        return cls.model_construct(
            **{
                name: _merge_rule(field.metadata).combine([getattr(c, name) for c in resolved])
                for name, field in cls.model_fields.items()
            }
        )

    def for_host(self, host: str) -> DownloadConfig:
        """These settings with the sleeps left unset filled in with `host`'s defaults."""
        site = default_sleeps(host)
        low = site.before_download_s if self.sleep_interval_s is None else self.sleep_interval_s
        high = self.max_sleep_interval_s
        between = self.sleep_requests_s
        return self.model_copy(
            update={
                "sleep_interval_s": low,
                "max_sleep_interval_s": max(
                    low, site.before_download_max_s if high is None else high
                ),
                "sleep_requests_s": site.between_requests_s if between is None else between,
            }
        )

    @property
    def min_speed_bytes_s(self) -> float | None:
        return self.min_speed_kb_s * 1024 or None

    @property
    def rate_limit_bytes(self) -> int | None:
        return None if self.rate_limit is None else _rate_bytes(self.rate_limit)

    @property
    def pauses(self) -> PausePolicy:
        return PausePolicy(base_s=self.pause_base_s, max_s=self.pause_max_s)


def _rate_bytes(rate: str) -> int:
    factor = {"K": 2**10, "M": 2**20, "G": 2**30}.get(rate[-1], 1)
    return int(float(rate.rstrip("KMG")) * factor)


def _merge_rule(metadata: list[Any]) -> MergeRule:
    return next(m for m in metadata if isinstance(m, MergeRule))
