"""Turning a project's `inputs` section into candidate videos.

Every source is tried; a source that fails (a search or listing that errors, an unreadable URL
file, a glob that matches nothing, a URL without a usable id) is reported by name and the others
go on, and so
is a path a glob matches that cannot be a video (a symbolic link loop, a name that is not UTF-8, a
FIFO, a device, a directory, a file not named as a video). The first source of a video wins when
it is found twice.

Bad input is bounded: URL and query files are read up to a size and a number of lines, a glob up
to a number of matches (inputs.max_*; over a cap the source is refused whole, not cut short), and
only the first PROBLEMS_KEPT problems are kept word for word; the others are counted.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.acquisition.politeness import host_key
from dataminer_dagster.acquisition.video_ids import (
    is_youtube_url,
    video_id_for_file,
    video_id_for_url,
    youtube_watch_url,
)
from dataminer_dagster.acquisition.ytdlp_search import YOUTUBE
from dataminer_dagster.assets.catalog.config import InputsConfig
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.core.path_kinds import not_a_regular_file
from dataminer_dagster.core.redact import redact
from dataminer_dagster.db.video_records import Candidate

VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}

SearchFunction = Callable[[str, int], list]  # (query, max_results) -> hits with .video_id
ListFunction = Callable[[str, int], list]  # (listing URL, max_entries) -> hits, newest first
PROBLEMS_KEPT = 20
NAMES_SHOWN = 5  # file names quoted in a problem about several files


@dataclass
class Collected:
    candidates: list[Candidate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the first PROBLEMS_KEPT
    problem_count: int = 0
    per_source: dict[str, int] = field(default_factory=dict)  # "search: <query>" -> videos found
    failed_sources: dict[str, str] = field(default_factory=dict)  # searches and listings: error
    _seen: set[str] = field(default_factory=set)

    def add(self, candidate: Candidate) -> None:
        if candidate.video_id not in self._seen:
            self._seen.add(candidate.video_id)
            self.candidates.append(candidate)

    def problem(self, text: str) -> None:
        self.problem_count += 1
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append(redact(text))  # logged and kept as metadata

    @property
    def problems_not_kept(self) -> int:
        return self.problem_count - len(self.problems)

    def summary(self) -> str:
        more = self.problems_not_kept
        return "; ".join(self.problems) + (f" (and {more} more problems)" if more else "")


def find_videos(
    inputs: InputsConfig,
    download: DownloadConfig,
    client,
    throttle_for: Callable[[DownloadConfig], object],
    *,
    skip: frozenset[str] = frozenset(),
) -> Collected:
    """The candidates of `inputs` as a catalog run finds them, for the catalog stage and
    `dataminer populate` alike: searches on YouTube and listings on their own hosts, each with
    the project's download settings for that host (cookies, proxies, pace), through the hosts'
    shared throttle, which `throttle_for` makes from the search options. `client`: the
    download_client resource."""
    options = download.for_host(YOUTUBE)
    throttle = throttle_for(options)
    search = functools.partial(client.search, options=options, throttle=throttle)

    def list_videos(url: str, max_entries: int) -> list:
        listing_options = download.for_host(host_key(url))
        return client.list_videos(url, max_entries, options=listing_options, throttle=throttle)

    return collect_candidates(inputs, search, list_videos, skip=skip)


def collect_candidates(
    inputs: InputsConfig,
    search: SearchFunction,
    list_videos: ListFunction | None = None,
    *,
    skip: frozenset[str] = frozenset(),
) -> Collected:
    """The candidates of every source of `inputs`. Searches and listings named in `skip` (their
    `per_source` keys: sources waiting for their back-off after failing) are not asked."""
    found = Collected()
    if inputs.search:
        for query in _queries(inputs, found):
            if f"search: {query}" in skip:
                continue
            try:
                hits = search(query, inputs.search.max_results_per_query)
            except HostPaused:
                raise  # YouTube said stop: not this query's fault, the whole search waits
            except Exception as exc:
                found.problem(f"search {query!r} failed: {exc}")
                found.failed_sources[f"search: {query}"] = redact(str(exc))
                continue
            found.per_source[f"search: {query}"] = len(hits)
            for hit in hits:
                found.add(
                    Candidate(hit.video_id, "search", query, url=youtube_watch_url(hit.video_id))
                )
    for url in inputs.listings:
        if f"listing: {url}" in skip:
            continue
        if list_videos is None:
            raise ValueError("the project has listings and no way to list them was given")
        try:
            hits = list_videos(url, inputs.max_per_listing)
        except HostPaused:
            raise  # the host said stop: every source of it waits
        except Exception as exc:
            found.problem(f"listing {redact(url)} failed: {exc}")
            found.failed_sources[f"listing: {url}"] = redact(str(exc))
            continue
        found.per_source[f"listing: {url}"] = len(hits)
        for hit in hits:
            found.add(Candidate(hit.video_id, "listing", url, url=hit.url))
    for url in inputs.urls:
        _add_url(found, url, "url", "config")
    if inputs.url_file:
        text = _read_list_file(Path(inputs.url_file), "url_file", inputs, found) or ""
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "//")):  # comments
                _add_url(found, line, "url_file", str(inputs.url_file))
    for pattern in inputs.files:
        _add_files(found, pattern, inputs.max_file_matches)
    return found


def _queries(inputs: InputsConfig, found: Collected) -> list[str]:
    search = inputs.search
    queries = list(search.queries)
    if search.queries_file:
        text = _read_list_file(Path(search.queries_file), "queries_file", inputs, found)
        queries += _parse_queries_file(text or "")
    return list(dict.fromkeys(q.strip() for q in queries if q.strip()))


def _read_list_file(path: Path, key: str, inputs: InputsConfig, found: Collected) -> str | None:
    """The text of a URL or query file; None (and a problem) when it is unreadable or over a cap.
    Reads at most the cap, so that /dev/zero or a runaway log cannot exhaust memory."""
    limit = int(inputs.max_list_file_mb * 2**20)
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        found.problem(f"{key} {path}: {exc.strerror or exc}")
        return None
    if len(data) > limit:
        found.problem(
            f"{key} {path}: larger than {inputs.max_list_file_mb:g} MB "
            "(inputs.max_list_file_mb); none of it was used"
        )
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        found.problem(f"{key} {path}: not UTF-8 text; none of it was used")
        return None
    if len(text.splitlines()) > inputs.max_list_file_lines:
        found.problem(
            f"{key} {path}: more than {inputs.max_list_file_lines:,} lines "
            "(inputs.max_list_file_lines); none of it was used"
        )
        return None
    return text


def _add_files(found: Collected, pattern: str, limit: int) -> None:
    """The video files `pattern` matches, each a candidate. A match that cannot be one (a symbolic
    link loop, a name that is not UTF-8, a FIFO, a device, a directory named like a video) is
    named as what it is and skipped, and so are the files whose name is not a video's: the good
    files are used either way."""
    matches = _video_files(pattern, limit)
    if matches is None:
        found.problem(
            f"files {pattern!r}: matches more than {limit:,} video files "
            "(inputs.max_file_matches); narrow the pattern or raise the limit"
        )
        return
    videos, not_videos, not_videos_count = matches
    if not_videos_count:
        shown = ", ".join(_printable(Path(p).name) for p in not_videos)
        more = (
            f" and {not_videos_count - len(not_videos)} more"
            if not_videos_count > len(not_videos)
            else ""
        )
        found.problem(
            f"files {pattern!r}: skipped {_files(not_videos_count)} not named as a video "
            f"({shown}{more}); video files end in {', '.join(sorted(VIDEO_SUFFIXES))}"
        )
    usable = 0
    for match in videos:
        reason = _unusable_match(match)
        if reason:
            found.problem(f"files {pattern!r}: skipped {_printable(match)}: {reason}")
            continue
        path = Path(match).resolve()
        found.add(Candidate(video_id_for_file(path), "file", pattern, source_path=str(path)))
        usable += 1
    found.per_source[f"files: {pattern}"] = usable
    if not videos:
        found.problem(f"files {pattern!r}: no video file matches")


def _video_files(pattern: str, limit: int) -> tuple[list[str], list[str], int] | None:
    """The paths `pattern` matches whose name is a video's, sorted; the first NAMES_SHOWN files
    whose name is not, and how many there are. None when there are more than `limit` of the
    first (the walk stops there, so `/**/*.mp4` does not list the whole filesystem first)."""
    videos, not_videos, not_videos_count = [], [], 0
    for match in glob.iglob(pattern, recursive=True):
        if Path(match).suffix.lower() in VIDEO_SUFFIXES:
            videos.append(match)
            if len(videos) > limit:
                return None
        elif not os.path.isdir(match):  # a folder a pattern walks through is no problem
            not_videos_count += 1
            if len(not_videos) < NAMES_SHOWN:
                not_videos.append(match)
    return sorted(videos), not_videos, not_videos_count


def _files(count: int) -> str:
    return "1 file" if count == 1 else f"{count:,} files"


def _unusable_match(match: str) -> str | None:
    """Why a path matched by a `files` pattern cannot be a video, or None."""
    try:
        match.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, which Python keeps as lone surrogates
        return "its name is not valid UTF-8; rename the file to use it"
    return not_a_regular_file(match)


def _printable(path: str) -> str:
    """A path as text that can be logged and stored: undecodable bytes shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _parse_queries_file(text: str) -> list[str]:
    """A YAML mapping with `queries: [...]`, or plain text with one query per line."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if isinstance(data, dict) and isinstance(data.get("queries"), list):
        return [str(q) for q in data["queries"]]
    return [
        line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("//")
    ]


def _add_url(found: Collected, url: str, source: str, info: str) -> None:
    try:
        video_id = video_id_for_url(url)
    except ValueError as exc:
        found.problem(f"{source} {url!r}: {exc}")
        return
    found.per_source[f"{source}: {info}"] = found.per_source.get(f"{source}: {info}", 0) + 1
    canonical = youtube_watch_url(video_id) if is_youtube_url(url) else url
    found.add(Candidate(video_id, source, info, url=canonical))
