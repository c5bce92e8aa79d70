"""The catalog stage's config: what a project's inputs are (`inputs:` in the project YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dataminer_dagster.core.config_section import Section


class SearchConfig(Section):
    queries: list[str] = Field(default_factory=list, description="YouTube search queries.")
    queries_file: Path | None = Field(
        None,
        description="File with more queries: a YAML list under `queries:`, or one query per line.",
    )
    max_results_per_query: int = Field(
        50, ge=1, le=1000, description="Videos taken from each query (the original's default)."
    )


class RefreshConfig(Section):
    cron: str = Field(
        description="When the project's sources are listed again, as a cron string "
        "(e.g. '0 */6 * * *': every six hours): the project's refresh_project_<name> schedule."
    )
    timezone: str = Field("UTC", description="The cron's time zone (an IANA name).")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str) -> str:
        from dagster._utils.schedules import is_valid_cron_string

        if not is_valid_cron_string(value):
            raise ValueError(f"{value!r} is not a cron string (five fields: 'M H DoM Mon DoW')")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"{value!r} is not a time zone name (e.g. UTC, Europe/Berlin)"
            ) from None
        return value


class InputsConfig(Section):
    RUN_SETTINGS = frozenset({"refresh"})  # when the sources are listed, not what they hold
    ADDED_LATER = frozenset({"listings", "max_per_listing"})

    search: SearchConfig | None = Field(
        None, description="YouTube searches (run by the video_catalog asset)."
    )
    urls: list[str] = Field(
        default_factory=list, description="Video URLs (YouTube or direct http(s) links)."
    )
    url_file: Path | None = Field(
        None,
        description="File with one URL per line; blank lines and lines starting with # or // are skipped.",
    )
    listings: list[str] = Field(
        default_factory=list,
        description="URLs that list videos and grow: RSS/Atom feeds, YouTube channels and "
        "playlists (anything yt-dlp lists). Read newest first, at most max_per_listing entries "
        "each time they are listed; a refresh links only the videos the project has not seen.",
    )
    max_per_listing: int = Field(
        50, ge=1, le=5000, description="Entries read from each listing, newest first."
    )
    refresh: RefreshConfig | None = Field(
        None,
        description="List the sources again on a schedule (`dataminer refresh NAME` does it on "
        "demand): searches, listings and URL files; new videos reopen a finished project.",
    )
    files: list[str] = Field(
        default_factory=list,
        description="Local video files or glob patterns; a match that cannot be a video (a "
        "name without a video suffix, a directory, a FIFO, a device, a symbolic link loop, a "
        "name that is not UTF-8) is named in the catalog's warnings and skipped.",
    )
    max_list_file_mb: float = Field(
        16,
        gt=0,
        le=1024,  # the file is read into memory whole
        description="Largest url_file or search.queries_file read (at most 1024: it is read "
        "into memory); a larger one is refused.",
    )
    max_list_file_lines: int = Field(
        100_000,
        ge=1,
        description="Most lines in a url_file or search.queries_file; more are refused.",
    )
    max_file_matches: int = Field(
        10_000,
        ge=1,
        description="Most video files one `files` pattern may match; more are refused.",
    )

    @model_validator(mode="after")
    def _has_a_source(self) -> InputsConfig:
        if not (self.search or self.urls or self.url_file or self.listings or self.files):
            raise ValueError("give at least one of search, urls, url_file, listings or files")
        return self


class TargetConfig(Section):
    images: int = Field(
        ge=1,
        description="Keep acquiring until the dataset holds this many images: each round lists "
        "the sources deeper and downloads the new videos of the sources whose videos keep the "
        "most frames (assets/catalog/source_choice.py), until the target, the budget or the sources run out.",
    )
    max_videos: int | None = Field(None, ge=1, description="Most videos the project links.")
    max_download_hours: float | None = Field(
        None, gt=0, description="Stop acquiring once the downloaded videos last this long."
    )
    max_download_gb: float | None = Field(
        None, gt=0, description="Stop acquiring once the downloaded videos take this much space."
    )
    max_rounds: int = Field(
        20, ge=1, le=1000, description="Most acquisition rounds (listings after the first)."
    )
    order: Literal["yield", "listed"] = Field(
        "yield",
        description="Which new videos a round takes: yield, from the sources whose videos keep "
        "the most frames (trying each source early); listed, in the order the sources list them.",
    )
