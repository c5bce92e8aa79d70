"""Turning a project's `inputs` section into candidate videos.

Every source is tried; a source that fails (a search that errors, an unreadable URL file, a glob
that matches nothing, a URL without a usable id) is reported by name and the others go on. The
first source of a video wins when it is found twice.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dataminer_dagster.config import InputsConfig
from dataminer_dagster.core.video_ids import (
    is_youtube_url,
    video_id_for_file,
    video_id_for_url,
    youtube_watch_url,
)
from dataminer_dagster.db.catalog import Candidate

VIDEO_SUFFIXES = {".mp4", ".webm", ".mkv", ".mov", ".avi", ".m4v", ".mpg", ".mpeg", ".ts"}

SearchFunction = Callable[[str, int], list]  # (query, max_results) -> hits with .video_id


@dataclass
class Collected:
    candidates: list[Candidate] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    per_source: dict[str, int] = field(default_factory=dict)  # "search: <query>" -> videos found
    _seen: set[str] = field(default_factory=set)

    def add(self, candidate: Candidate) -> None:
        if candidate.video_id not in self._seen:
            self._seen.add(candidate.video_id)
            self.candidates.append(candidate)


def collect_candidates(inputs: InputsConfig, search: SearchFunction) -> Collected:
    found = Collected()
    if inputs.search:
        for query in _queries(inputs, found):
            try:
                hits = search(query, inputs.search.max_results_per_query)
            except Exception as exc:
                found.problems.append(f"search {query!r} failed: {exc}")
                continue
            found.per_source[f"search: {query}"] = len(hits)
            for hit in hits:
                found.add(
                    Candidate(hit.video_id, "search", query, url=youtube_watch_url(hit.video_id))
                )
    for url in inputs.urls:
        _add_url(found, url, "url", "config")
    if inputs.url_file:
        try:
            lines = Path(inputs.url_file).read_text().splitlines()
        except OSError as exc:
            found.problems.append(f"url_file {inputs.url_file}: {exc.strerror or exc}")
            lines = []
        for line in lines:
            line = line.strip()
            if line and not line.startswith("//"):
                _add_url(found, line, "url_file", str(inputs.url_file))
    for pattern in inputs.files:
        matches = sorted(
            p
            for p in glob.glob(pattern, recursive=True)
            if Path(p).suffix.lower() in VIDEO_SUFFIXES
        )
        found.per_source[f"files: {pattern}"] = len(matches)
        if not matches:
            found.problems.append(f"files {pattern!r}: no video file matches")
        for match in matches:
            path = Path(match).resolve()
            found.add(Candidate(video_id_for_file(path), "file", pattern, source_path=str(path)))
    return found


def _queries(inputs: InputsConfig, found: Collected) -> list[str]:
    search = inputs.search
    queries = list(search.queries)
    if search.queries_file:
        try:
            text = Path(search.queries_file).read_text()
        except OSError as exc:
            found.problems.append(f"queries_file {search.queries_file}: {exc.strerror or exc}")
            return queries
        queries += _parse_queries_file(text)
    return list(dict.fromkeys(q.strip() for q in queries if q.strip()))


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
        found.problems.append(f"{source} {url!r}: {exc}")
        return
    found.per_source[f"{source}: {info}"] = found.per_source.get(f"{source}: {info}", 0) + 1
    canonical = youtube_watch_url(video_id) if is_youtube_url(url) else url
    found.add(Candidate(video_id, source, info, url=canonical))
