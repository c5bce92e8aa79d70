"""Lines that would repeat themselves are said once per period, with a count of those left out."""

from __future__ import annotations

from dataminer_dagster.core.progress import RepeatedLines


def test_a_repeated_line_is_said_once_per_period_with_the_count_left_out():
    now = [0.0]
    lines = RepeatedLines(every_s=60, clock=lambda: now[0])
    said = []
    for second in range(0, 150, 2):  # a try every 2 s for two and a half minutes
        now[0] = float(second)
        said.append(lines.line("the disk is full", f"frames v{second} postponed"))
    shown = [line for line in said if line is not None]
    assert shown == [
        "frames v0 postponed",
        "frames v60 postponed (29 more like it in the 1m00s before were not logged)",
        "frames v120 postponed (29 more like it in the 1m00s before were not logged)",
    ]


def test_topics_are_counted_apart():
    now = [0.0]
    lines = RepeatedLines(every_s=60, clock=lambda: now[0])
    assert lines.line("the disk is full", "a") == "a"
    assert lines.line("download", "b") == "b", "another topic is said at once"
    assert lines.line("the disk is full", "c") is None
    now[0] = 61.0
    assert (
        lines.line("the disk is full", "d")
        == "d (1 more like it in the 1m01s before were not logged)"
    )
    assert lines.line("download", "e") == "e"
