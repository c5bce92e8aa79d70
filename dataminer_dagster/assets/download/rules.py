"""The rules a project sets on what it downloads (blocked hashtags, duration, size), checked on
yt-dlp's metadata before a download and on the file after it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from dataminer_dagster.acquisition.errors import DownloadBlocked
from dataminer_dagster.assets.download.config import DownloadConfig

_DESCRIPTION_HASHTAG = re.compile(r"#(\w+)")


def normalise_hashtag(tag: str) -> str:
    return tag.strip().lstrip("#").strip().casefold()


def video_hashtags(info: dict[str, Any]) -> set[str]:
    """Normalised tags: yt-dlp's `tags` plus `#word` hashtags in the title and description."""
    tags = {normalise_hashtag(t) for t in info.get("tags") or () if isinstance(t, str)}
    for field in ("title", "description"):
        text = info.get(field)
        if isinstance(text, str):
            tags.update(m.casefold() for m in _DESCRIPTION_HASHTAG.findall(text))
    tags.discard("")
    return tags


def blocked_hashtag(info: dict[str, Any], blocked: Iterable[str]) -> str | None:
    """The first blocked tag that the video carries as a WHOLE tag ("cover" != "#discover")."""
    tags = video_hashtags(info)
    for pattern in blocked:
        normalised = normalise_hashtag(pattern)
        if normalised and normalised in tags:
            return normalised
    return None


def check_download_rules(info: dict[str, Any], options: DownloadConfig, *, subject: str) -> None:
    """Raise DownloadBlocked when the metadata breaks a rule; `subject` names the video."""
    tag = blocked_hashtag(info, options.blocked_hashtags)
    if tag is not None:
        raise DownloadBlocked(
            f"{subject} is blocked: it carries the hashtag #{tag}", rule="hashtag"
        )
    check_duration(info.get("duration"), options, subject)
    check_filesize(expected_size(info), options, subject)


def check_duration(duration: float | None, options: DownloadConfig, subject: str) -> None:
    if duration is not None and duration > options.max_duration_s:
        raise DownloadBlocked(
            f"{subject} is blocked: it lasts {duration:.1f} s, over the limit of "
            f"{options.max_duration_s:g} s",
            rule="duration",
        )


def check_filesize(size: int | None, options: DownloadConfig, subject: str) -> None:
    if size is not None and size > options.max_filesize_mb * 1024 * 1024:
        raise DownloadBlocked(
            f"{subject} is blocked: it is {size / 2**20:.1f} MB, over the limit of "
            f"{options.max_filesize_mb:g} MB",
            rule="filesize",
        )


def expected_size(info: dict[str, Any]) -> int | None:
    """The bytes the selected formats will take, when yt-dlp knows (or estimates) each one."""
    formats = info.get("requested_formats") or [info]
    sizes = [f.get("filesize") or f.get("filesize_approx") for f in formats]
    return int(sum(sizes)) if sizes and all(sizes) else None
