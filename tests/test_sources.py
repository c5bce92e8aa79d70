"""Turning a project's inputs into candidate videos: every source tried, every failure named."""

from __future__ import annotations

from pathlib import Path

from dataminer_dagster.config import InputsConfig, SearchConfig
from dataminer_dagster.downloading import SearchHit
from dataminer_dagster.sources import collect_candidates


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
        "// a comment\n\nhttps://youtu.be/AAAAAAAAAAA?t=3\nhttps://example.com/clips/a.mp4\nnot a url\n"
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
    assert "no video file matches" in problems and "none" in problems
    assert found.per_source["search: doors"] == 2


def test_a_missing_url_file_is_reported_not_fatal(tmp_path: Path):
    inputs = InputsConfig(urls=["https://youtu.be/AAAAAAAAAAA"], url_file=tmp_path / "missing.txt")
    found = collect_candidates(inputs, _search({}))
    assert [c.video_id for c in found.candidates] == ["AAAAAAAAAAA"]
    assert found.problems and "missing.txt" in found.problems[0]
