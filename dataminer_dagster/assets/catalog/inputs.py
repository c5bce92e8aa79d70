"""Turning a project's `inputs` section into candidate videos.

Every source is tried; a source that fails (a search or listing that errors, an unreadable URL
file, a glob that matches nothing, a URL without a usable id) is reported by name and the others
go on, and so
is a path a glob matches that cannot be a video (a symbolic link loop, a name that is not UTF-8, a
FIFO, a device, a directory, a file not named as a video). The first source of a video wins when
it is found twice.

Bad input is bounded: URL and query files are read up to a size and a number of lines, a glob up
to a number of matches (inputs.max_*; over a cap the source is refused whole, not cut short), and
only the first PROBLEMS_KEPT problems are kept word for word, each cut to PROBLEM_CHARS; the
others are counted. A bad line of a URL or query file (bytes that are not UTF-8, a control
character, longer than MAX_LINE_CHARS) is refused with its line number and the other lines are
used; a YAML query file is read within the bounds of `core.bounded_text.load_yaml`.
"""

from __future__ import annotations

import functools
import glob
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dataminer_dagster.acquisition.egress import refused_literal_address
from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.acquisition.politeness import host_key
from dataminer_dagster.acquisition.video_ids import (
    Candidate,
    is_youtube_url,
    video_id_for_file,
    video_id_for_url,
    youtube_watch_url,
)
from dataminer_dagster.acquisition.ytdlp_search import YOUTUBE
from dataminer_dagster.assets.catalog.config import InputsConfig
from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.core.bounded_text import BoundedTextError, NotYaml, cut, load_yaml, shown
from dataminer_dagster.core.path_kinds import not_a_regular_file
from dataminer_dagster.core.redact import redact

VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}

SearchFunction = Callable[[str, int], list]  # (query, max_results) -> hits with .video_id
ListFunction = Callable[[str, int], list]  # (listing URL, max_entries) -> hits, newest first
PROBLEMS_KEPT = 20
PROBLEM_CHARS = 500  # a problem as logged and kept: a line, not a copy of a pasted file
# The longest line of a URL or query file used (web servers refuse longer URLs).
MAX_LINE_CHARS = 8192
_CONTROL = frozenset(chr(c) for c in (*range(32), 127)) - {"\t"}
NAMES_SHOWN = 5  # file names quoted in a problem about several files


@dataclass
class Collected:
    candidates: list[Candidate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the first PROBLEMS_KEPT
    problem_count: int = 0
    per_source: dict[str, int] = field(default_factory=dict)  # "search: <query>" -> videos found
    failed_sources: dict[str, str] = field(default_factory=dict)  # searches and listings: error
    # Whether a problem may go away by itself (a search or listing that failed, a file that could
    # not be read): a catalog that found nothing is then tried again, else it is dead at once.
    transient: bool = False
    _seen: set[str] = field(default_factory=set)

    def add(self, candidate: Candidate) -> None:
        if candidate.video_id not in self._seen:
            self._seen.add(candidate.video_id)
            self.candidates.append(candidate)

    def problem(self, text: str, *, transient: bool = False) -> None:
        self.problem_count += 1
        self.transient = self.transient or transient
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append(cut(redact(text), PROBLEM_CHARS))  # logged and kept as metadata

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
                found.problem(f"search {shown(query)} failed: {exc}", transient=True)
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
            found.problem(f"listing {redact(url)} failed: {exc}", transient=True)
            found.failed_sources[f"listing: {url}"] = redact(str(exc))
            continue
        found.per_source[f"listing: {url}"] = len(hits)
        for hit in hits:
            found.add(Candidate(hit.video_id, "listing", url, url=hit.url))
    for url in inputs.urls:
        _add_url(found, url, "url", "config", f"url {shown(url, 100)}")
    if inputs.url_file:
        path = Path(inputs.url_file)
        for number, line in _usable_lines(path, "url_file", inputs, found):
            line = line.strip()
            if line and not line.startswith(("#", "//")):  # comments
                _add_url(found, line, "url_file", str(path), f"url_file {path} line {number}")
    for pattern in inputs.files:
        _add_files(found, pattern, inputs.max_file_matches)
    return found


def _queries(inputs: InputsConfig, found: Collected) -> list[str]:
    search = inputs.search
    queries = list(search.queries)
    if search.queries_file:
        queries += _queries_file(Path(search.queries_file), inputs, found)
    return list(dict.fromkeys(q.strip() for q in queries if q.strip()))


def _read_list_file(path: Path, key: str, inputs: InputsConfig, found: Collected) -> bytes | None:
    """The bytes of a URL or query file; None (and a problem) when it is unreadable or over a cap.
    Reads at most the cap, so that /dev/zero or a runaway log cannot exhaust memory."""
    limit = int(inputs.max_list_file_mb * 2**20)
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:  # a missing file may yet be written, a share come back
        found.problem(f"{key} {path}: {exc.strerror or exc}", transient=True)
        return None
    if len(data) > limit:
        found.problem(
            f"{key} {path}: larger than {inputs.max_list_file_mb:g} MB "
            "(inputs.max_list_file_mb); none of it was used"
        )
        return None
    if len(data.splitlines()) > inputs.max_list_file_lines:
        found.problem(
            f"{key} {path}: more than {inputs.max_list_file_lines:,} lines "
            "(inputs.max_list_file_lines); none of it was used"
        )
        return None
    return data


def _usable_lines(
    path: Path, key: str, inputs: InputsConfig, found: Collected
) -> list[tuple[int, str]]:
    """The lines of a URL or query file with their numbers (from 1), but those refused, each
    named by its number: bytes that are not UTF-8, a control character, over MAX_LINE_CHARS."""
    data = _read_list_file(path, key, inputs, found)
    if data is None:
        return []
    lines = []
    for number, raw in enumerate(data.splitlines(), start=1):
        reason = _bad_line(raw)
        if reason:
            found.problem(f"{key} {path} line {number}: {reason}; the line was not used")
        else:
            lines.append((number, raw.decode("utf-8")))
    return lines


def _bad_line(raw: bytes) -> str | None:
    if len(raw) > MAX_LINE_CHARS:
        return f"{len(raw):,} bytes long, over {MAX_LINE_CHARS:,}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start + 1} is {raw[exc.start : exc.start + 1]!r})"
    bad = next((c for c in text if c in _CONTROL), None)
    if bad is not None:
        return f"holds the control character {bad!r} at position {text.index(bad) + 1}"
    return None


def _queries_file(path: Path, inputs: InputsConfig, found: Collected) -> list[str]:
    """The queries of a query file: a YAML mapping with `queries: [...]`, or plain text with one
    query per line ('//' starts a comment line)."""
    key = "queries_file"
    lines = _usable_lines(path, key, inputs, found)
    try:
        data = load_yaml(
            "\n".join(text for _, text in lines), max_values=inputs.max_list_file_lines
        )
    except NotYaml:
        data = None
    except BoundedTextError as exc:
        found.problem(f"{key} {path}: {exc}; none of it was used")
        return []
    if isinstance(data, dict) and isinstance(data.get("queries"), list):
        queries = []
        for number, query in enumerate(data["queries"], start=1):
            if (
                isinstance(query, str)
                and len(query) <= MAX_LINE_CHARS
                and not _CONTROL & set(query)
            ):
                queries.append(query)
            else:
                found.problem(
                    f"{key} {path} query {number}: {shown(query, 100)} is not a line of text; "
                    "it was not used"
                )
        return queries
    return [text for _, text in lines if text.strip() and not text.lstrip().startswith("//")]


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
    """The paths `pattern` matches whose name is a video's, sorted; the NAMES_SHOWN first by name
    of the files whose name is not (the same whatever order the file system lists a folder in),
    and how many there are. None when there are more than `limit` of the first (the walk stops
    there, so `/**/*.mp4` does not list the whole filesystem first)."""
    videos, not_videos, not_videos_count = [], [], 0
    for match in glob.iglob(pattern, recursive=True):
        if Path(match).suffix.lower() in VIDEO_SUFFIXES:
            videos.append(match)
            if len(videos) > limit:
                return None
        elif not os.path.isdir(match):  # a folder a pattern walks through is no problem
            not_videos_count += 1
            not_videos.append(match)
            if len(not_videos) > NAMES_SHOWN:
                not_videos.sort()
                not_videos.pop()
    return sorted(videos), sorted(not_videos), not_videos_count


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


def _add_url(found: Collected, url: str, source: str, info: str, where: str) -> None:
    """`url` as a candidate; a URL without a usable id, or one naming an address no project may
    fetch from, is a problem named by `where` (the key, or the file and line)."""
    try:
        video_id = video_id_for_url(url)
    except ValueError as exc:
        found.problem(f"{where}: {exc}")
        return
    refused = refused_literal_address(url)
    if refused:
        found.problem(f"{where}: {refused}")
        return
    found.per_source[f"{source}: {info}"] = found.per_source.get(f"{source}: {info}", 0) + 1
    canonical = youtube_watch_url(video_id) if is_youtube_url(url) else url
    found.add(Candidate(video_id, source, info, url=canonical))
