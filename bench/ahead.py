"""What runs requested ahead buy: the same project under a real `dagster-daemon run`, from
`dataminer project add` to complete, with the filter and project lanes requested ahead of their
input (the default) and with `lanes: {filter: {ahead: false}, project: {ahead: false}}`, in one
command. Each trial runs both, in alternating order, each on a fresh deployment
(bench/demo_daemon.py's `trial`), so that a change in the machine's load falls on both.

    python bench/ahead.py [--videos 6] [--trials 3]

`--videos 6` is the demo's project; more videos are more copies of the demo's clips (the same
generator, other seeds), each behind its own URL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from crash_recovery import DEFAULTS
from demo_daemon import trial

NO_AHEAD = {**DEFAULTS, "lanes": {"filter": {"ahead": False}, "project": {"ahead": False}}}
WAYS = {"ahead": DEFAULTS, "no ahead": NO_AHEAD}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=6)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()

    from dataminer_dagster.core.synthetic import write_scene_clips
    from dataminer_dagster.demo import serve_directory
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    print(
        f"{args.videos} videos, {args.trials} trials; load average at the start: {os.getloadavg()}"
    )
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="dm-ahead-") as root:
        www = Path(root) / "www"
        names = [p.name for p in write_scene_clips(www, args.videos)]
        siglip = build_tiny_siglip(Path(root) / "siglip")
        yolo = build_tiny_yolo(Path(root) / "yolo.pt")
        with serve_directory(www) as base:
            urls = [f"{base}/{name}" for name in names]
            for n in range(args.trials):
                order = list(WAYS) if n % 2 == 0 else list(reversed(WAYS))
                for way in order:
                    elapsed, failed = trial(urls, siglip, yolo, WAYS[way])
                    seconds[way].append(elapsed)
                    print(
                        f"trial {n + 1}, {way}: complete in {elapsed:.1f} s, {failed} failed ticks"
                    )
    ahead, without = (statistics.median(seconds[way]) for way in WAYS)
    print(
        f"median: ahead {ahead:.1f} s, no ahead {without:.1f} s: ahead takes "
        f"{ahead / without:.3f}x the time without ({(1 - ahead / without) * 100:+.1f} % saved)"
    )
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
