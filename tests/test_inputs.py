"""Turning a project's inputs into candidate videos: every source tried, every failure named."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from dataminer_dagster.acquisition.errors import HostPaused, Pause
from dataminer_dagster.acquisition.ytdlp_search import SearchHit
from dataminer_dagster.assets.catalog.config import InputsConfig, SearchConfig
from dataminer_dagster.assets.catalog.inputs import PROBLEMS_KEPT, collect_candidates


def _search(results: dict[str, list[str]]):
    def search(query: str, max_results: int) -> list[SearchHit]:
        if query not in results:
            raise RuntimeError("HTTP Error 429: Too Many Requests")
        return [
            SearchHit(v, f"https://www.youtube.com/watch?v={v}", None, None)
            for v in results[query][:max_results]
        ]

    return search


def test_every_source_is_used_and_the_first_source_of_a_video_wins(tmp_path: Path):
    (tmp_path / "queries.yaml").write_text("queries:\n  - doors\n  - windows\n")
    (tmp_path / "urls.txt").write_text(
        "// a comment\n# another comment\n  # an indented one\n\n"
        "https://youtu.be/AAAAAAAAAAA?t=3\nhttps://example.com/clips/a.mp4\nnot a url\n"
    )
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "one.mp4").write_bytes(b"x")
    (tmp_path / "clips" / "notes.txt").write_text("not a video")
    inputs = InputsConfig(
        search=SearchConfig(
            queries=["doors"], queries_file=tmp_path / "queries.yaml", max_results_per_query=2
        ),
        urls=["https://www.youtube.com/watch?v=BBBBBBBBBBB"],
        url_file=tmp_path / "urls.txt",
        files=[str(tmp_path / "clips" / "*"), str(tmp_path / "none" / "*.mp4")],
    )
    found = collect_candidates(
        inputs, _search({"doors": ["AAAAAAAAAAA", "CCCCCCCCCCC", "DDDDDDDDDDD"]})
    )

    by_id = {c.video_id: c for c in found.candidates}
    assert [c.video_id for c in found.candidates[:2]] == ["AAAAAAAAAAA", "CCCCCCCCCCC"], (
        "max results per query"
    )
    assert by_id["AAAAAAAAAAA"].source == "search" and by_id["AAAAAAAAAAA"].source_info == "doors"
    assert by_id["BBBBBBBBBBB"].url == "https://www.youtube.com/watch?v=BBBBBBBBBBB"
    assert any(
        c.url == "https://example.com/clips/a.mp4" and c.source == "url_file"
        for c in found.candidates
    )
    local = [c for c in found.candidates if c.source == "file"]
    assert [Path(c.source_path).name for c in local] == ["one.mp4"], "only video files"
    problems = "\n".join(found.problems)
    assert "search 'windows' failed: HTTP Error 429" in problems, (
        "a failing search is named, the rest goes on"
    )
    assert "'not a url'" in problems
    assert "comment" not in problems, "comment lines are not bad URLs"
    assert "no video file matches" in problems and "none" in problems
    assert found.per_source["search: doors"] == 2


def test_a_missing_url_file_is_reported_not_fatal(tmp_path: Path):
    inputs = InputsConfig(urls=["https://youtu.be/AAAAAAAAAAA"], url_file=tmp_path / "missing.txt")
    found = collect_candidates(inputs, _search({}))
    assert [c.video_id for c in found.candidates] == ["AAAAAAAAAAA"]
    assert found.problems and "missing.txt" in found.problems[0]


def test_a_huge_file_of_bad_urls_reports_the_first_problems_and_a_count(tmp_path: Path):
    bad = [f"not a url {n}" for n in range(99_999)]  # 100,000 lines: the default cap
    (tmp_path / "urls.txt").write_text("\n".join(["https://youtu.be/AAAAAAAAAAA", *bad]))
    inputs = InputsConfig(url_file=tmp_path / "urls.txt")
    found = collect_candidates(inputs, _search({}))
    assert [c.video_id for c in found.candidates] == ["AAAAAAAAAAA"]
    assert found.problem_count == 99_999
    assert len(found.problems) == PROBLEMS_KEPT
    assert "'not a url 0'" in found.problems[0]
    assert found.summary().endswith(f"(and {99_999 - PROBLEMS_KEPT} more problems)")


@pytest.mark.parametrize(
    ("content", "limits", "expected"),
    [
        ("https://youtu.be/AAAAAAAAAAA\n" * 11, {"max_list_file_lines": 10}, "more than 10 lines"),
        ("x" * 2 * 2**20, {"max_list_file_mb": 1}, "larger than 1 MB"),
    ],
)
def test_a_url_file_over_its_caps_is_refused_by_name(tmp_path: Path, content, limits, expected):
    path = tmp_path / "urls.txt"
    path.write_text(content)
    inputs = InputsConfig(urls=["https://youtu.be/BBBBBBBBBBB"], url_file=path, **limits)
    found = collect_candidates(inputs, _search({}))
    assert [c.video_id for c in found.candidates] == ["BBBBBBBBBBB"], "nothing from the file"
    [problem] = found.problems
    assert problem.startswith(f"url_file {path}: {expected}"), problem


def test_an_endless_url_file_is_read_no_further_than_its_cap():
    found = collect_candidates(InputsConfig(url_file=Path("/dev/zero")), _search({}))
    assert not found.candidates
    assert found.problems == [
        "url_file /dev/zero: larger than 16 MB (inputs.max_list_file_mb); none of it was used"
    ]


def test_a_glob_matching_more_files_than_the_cap_is_refused(tmp_path: Path):
    for n in range(6):
        (tmp_path / f"clip{n}.mp4").write_bytes(b"x")
    pattern = str(tmp_path / "**" / "*.mp4")
    found = collect_candidates(InputsConfig(files=[pattern], max_file_matches=5), _search({}))
    assert not found.candidates
    assert found.problems == [
        f"files {pattern!r}: matches more than 5 video files (inputs.max_file_matches); "
        "narrow the pattern or raise the limit"
    ]
    found = collect_candidates(InputsConfig(files=[pattern], max_file_matches=6), _search({}))
    assert len(found.candidates) == 6 and not found.problems


def test_a_paused_youtube_stops_the_whole_search(tmp_path: Path):
    """YouTube said stop: no later query is sent, and the caller postpones the catalog."""
    asked = []

    def paused(query: str, max_results: int):
        asked.append(query)
        raise HostPaused(
            Pause("youtube.com", datetime.now(UTC), 60, "rate limited", "HTTP 429"), met=True
        )

    inputs = InputsConfig(search=SearchConfig(queries=["doors", "windows"]))
    with pytest.raises(HostPaused):
        collect_candidates(inputs, paused)
    assert asked == ["doors"]


def test_matches_that_cannot_be_videos_are_named_and_the_good_files_used(tmp_path: Path):
    """A symbolic link loop used to fail the whole catalog ("RuntimeError: Symlink loop"), and a
    name that is not UTF-8 failed it too without naming the file; a FIFO, a directory and a
    device were "file not found" at download, and an audio file was skipped without a word."""
    clips = tmp_path / "clips"
    clips.mkdir()
    for name in ("good.mp4", "other.webm"):
        (clips / name).write_bytes(b"a video, as far as its name says")
    (clips / "loop.mp4").symlink_to("loop.mp4")
    os.mkfifo(clips / "pipe.mp4")
    (clips / "dir.mp4").mkdir()
    (clips / "zero.mp4").symlink_to("/dev/zero")
    (clips / "gone.mp4").symlink_to(clips / "deleted.mp4")
    (clips / "audioonly.m4a").write_bytes(b"an audio file")
    (clips / "notes.txt").write_text("not a video")
    latin1 = os.fsencode(clips) + b"/caf\xe9.mp4"  # "cafe" with an accent, in Latin-1
    with open(latin1, "wb") as handle:
        handle.write(b"a video with a name that is not UTF-8")
    pattern = str(clips / "*")

    found = collect_candidates(InputsConfig(files=[pattern]), _search({}))

    assert sorted(Path(c.source_path).name for c in found.candidates) == [
        "good.mp4",
        "other.webm",
    ]
    assert found.per_source == {f"files: {pattern}": 2}
    prefix = f"files {pattern!r}: skipped "
    assert sorted(found.problems) == sorted(
        [
            f"{prefix}2 files not named as a video (audioonly.m4a, notes.txt); video files end in "
            ".avi, .m4v, .mkv, .mov, .mp4, .mpeg, .mpg, .ts, .webm",
            f"{prefix}{clips}/caf\\xe9.mp4: its name is not valid UTF-8; rename the file to use it",
            f"{prefix}{clips}/dir.mp4: a directory, not a regular file",
            f"{prefix}{clips}/gone.mp4: a broken symbolic link (to {clips}/deleted.mp4, which "
            "does not exist)",
            f"{prefix}{clips}/loop.mp4: a symbolic link loop (its links lead back to themselves), "
            "not a regular file",
            f"{prefix}{clips}/pipe.mp4: a named pipe (FIFO), not a regular file",
            f"{prefix}{clips}/zero.mp4: a character device (a symbolic link to /dev/zero), not a "
            "regular file",
        ]
    )


def test_a_glob_of_files_that_cannot_be_videos_leaves_no_candidate(tmp_path: Path):
    (tmp_path / "loop.mp4").symlink_to("loop.mp4")
    (tmp_path / "song.m4a").write_bytes(b"an audio file")
    pattern = str(tmp_path / "*")

    found = collect_candidates(InputsConfig(files=[pattern]), _search({}))

    assert not found.candidates
    assert found.per_source == {f"files: {pattern}": 0}
    assert [p.split(": ", 1)[1] for p in found.problems] == [
        "skipped 1 file not named as a video (song.m4a); video files end in .avi, .m4v, .mkv, "
        ".mov, .mp4, .mpeg, .mpg, .ts, .webm",
        f"skipped {tmp_path}/loop.mp4: a symbolic link loop (its links lead back to themselves), "
        "not a regular file",
    ]
