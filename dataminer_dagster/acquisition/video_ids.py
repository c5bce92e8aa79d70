"""Video ids: the `videos` partition key of every video, derived from its URL or file path.

YouTube videos keep their 11-character id. Any other http(s) URL, and any local file, gets a
stable id made of a short slug (for humans) and a hash (for uniqueness). Ids use only
``[A-Za-z0-9_-]``: they are file names (``videos/<id>.mp4``) and are joined with project names
by ``.`` in ``project_videos`` partition keys, so they never contain a dot. Derived ids are at
least 16 characters long, so they can never be mistaken for an 11-character YouTube id.
"""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from dataminer_dagster.core.bounded_text import shown

YOUTUBE_ID = re.compile(r"[A-Za-z0-9_-]{11}")
YOUTUBE_HOSTS = frozenset(
    {
        "youtube.com",
        "www.youtube.com",
        "m.youtube.com",
        "music.youtube.com",
        "youtu.be",
        "www.youtu.be",
        "youtube-nocookie.com",
        "www.youtube-nocookie.com",
    }
)
# youtube.com/<kind>/<id>
_PATH_KINDS = frozenset({"embed", "v", "e", "shorts", "live"})

_SLUG_MAX = 20
_HASH_CHARS = 16  # 64 bits of SHA-256: collisions are negligible at millions of videos
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Longer URLs are refused: web servers refuse them too, and a pasted file is not a URL.
MAX_URL_CHARS = 8192


def is_youtube_url(url: str) -> bool:
    """True for an http(s) URL on a YouTube host (whether or not it names a video)."""
    try:
        parts = urlsplit(url.strip())
    except (AttributeError, ValueError):
        return False
    return parts.scheme.lower() in ("http", "https") and (parts.hostname or "") in YOUTUBE_HOSTS


def youtube_watch_url(video_id: str) -> str:
    """The canonical watch URL of a YouTube id (no playlist or tracking parameters)."""
    if not YOUTUBE_ID.fullmatch(video_id):
        raise ValueError(
            f"{video_id!r} is not a YouTube video id (11 characters of A-Z a-z 0-9 _ -)"
        )
    return f"https://www.youtube.com/watch?v={video_id}"


def video_id_for_url(url: str) -> str:
    """The id of the video at `url`; ValueError (naming the URL) when no id can be derived."""
    parts = _split_http_url(url)
    host = parts.hostname or ""
    if host in YOUTUBE_HOSTS:
        return _youtube_id(url, host, parts.path, parts.query)
    return _derived_id(_last_segment(parts.path) or host, _normalised_url(parts))


def video_id_for_file(path: str | os.PathLike[str]) -> str:
    """A stable id for a local file: a slug of its name and a hash of its absolute path."""
    text = os.fspath(path)
    if not text.strip():
        raise ValueError("cannot derive a video id from an empty file path")
    absolute = os.path.normpath(os.path.abspath(os.path.expanduser(text)))
    return _derived_id(Path(absolute).stem, absolute)


def _split_http_url(url: str):
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"cannot derive a video id from an empty URL: {shown(url, 100)}")
    text = url.strip()
    if len(text) > MAX_URL_CHARS:
        raise ValueError(
            f"cannot derive a video id from {shown(url, 100)}: the URL is longer than "
            f"{MAX_URL_CHARS:,} characters"
        )
    if any(ch.isspace() for ch in text):
        raise ValueError(f"cannot derive a video id from {url!r}: the URL contains whitespace")
    if any(ch < " " or ch == "\x7f" for ch in text):
        raise ValueError(
            f"cannot derive a video id from {url!r}: the URL contains a control character"
        )
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as exc:
        raise ValueError(f"cannot derive a video id from {url!r}: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(
            f"cannot derive a video id from {url!r}: only http(s) URLs are supported "
            "(write the full URL, e.g. https://www.youtube.com/watch?v=...)"
        )
    if not parts.hostname:
        raise ValueError(f"cannot derive a video id from {url!r}: the URL has no host")
    return parts


def _youtube_id(url: str, host: str, path: str, query: str) -> str:
    segments = [s for s in path.split("/") if s]
    candidate = None
    if host.endswith("youtu.be"):
        candidate = segments[0] if segments else None
    elif segments[:1] == ["watch"]:
        candidate = next(iter(parse_qs(query).get("v", [])), None)
    elif len(segments) >= 2 and segments[0] in _PATH_KINDS:
        candidate = segments[1]
    if candidate is None:
        raise ValueError(
            f"{url!r} is a YouTube URL without a video id "
            "(expected watch?v=, youtu.be/, /embed/, /v/, /shorts/ or /live/)"
        )
    if not YOUTUBE_ID.fullmatch(candidate):
        raise ValueError(
            f"{url!r} has an invalid YouTube video id {candidate!r} "
            "(expected 11 characters of A-Z a-z 0-9 _ -)"
        )
    return candidate


def _last_segment(path: str) -> str:
    segments = [s for s in path.split("/") if s]
    if not segments:
        return ""
    name = unquote(segments[-1])
    stem, dot, _ = name.rpartition(".")
    return stem if dot and stem else name


def _normalised_url(parts) -> str:
    """Scheme and host lower-cased, default port and fragment dropped, query sorted."""
    scheme = parts.scheme.lower()
    netloc = parts.hostname or ""
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(scheme):
        netloc = f"{netloc}:{parts.port}"
    if parts.username or parts.password:
        netloc = f"{parts.username or ''}:{parts.password or ''}@{netloc}"
    query = urlencode(sorted(parse_qsl(parts.query, keep_blank_values=True)))
    return urlunsplit((scheme, netloc, parts.path or "/", query, ""))


def _derived_id(name: str, identity: str) -> str:
    digest = hashlib.sha256(identity.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    slug = _slug(name)
    return f"{slug}-{digest}" if slug else digest


def _slug(name: str) -> str:
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return _UNSAFE.sub("-", ascii_name).strip("-_").lower()[:_SLUG_MAX].strip("-_")


@dataclass(frozen=True)
class Candidate:
    """A video found by the catalog: a remote URL or a local file, and where it came from."""

    video_id: str
    source: str  # search | url | url_file | file | manual
    source_info: str | None = None
    url: str | None = None
    source_path: str | None = None
