"""Random fault schedules on simulated machines: the checks of tests/test_faults.py over many
schedules.

Two worker machines (network and pid namespaces) run `dataminer run` on one project of synthetic
clips against a scratch PostgreSQL 15 cluster reached over veth pairs, with short leases (heartbeat
0.3 s, stale after 3 s). Each schedule has one to three faults at random times within the clean
run's length, drawn from: a partition of one machine, the database stopped (`pg_ctl stop -m fast` or
`-m immediate`) and started again, a COMMIT's answer cut off (`pg_terminate_backend` at COMMIT), a
machine's clock off by 1-10 minutes, a machine SIGKILLed and started again, the data disk full,
the database's disk full; half the schedules only of faults that must cost no attempt (tests/helpers/faults.py). After each,
the checker (tests/helpers/fault_checks.py) counts what went wrong. Needs root, iproute2 and
PostgreSQL 15's server binaries.

    python bench/faults.py [--schedules 200] [--seed 0] [--workers 2] [--clips 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.faults import KINDS, FaultLab, random_schedule  # noqa: E402

OUTCOMES = (
    ("items lost", lambda o: len(o.items_not_done)),
    ("recorded files missing", lambda o: len(o.recorded_missing)),
    ("unrecorded files left", lambda o: len(o.unrecorded)),
    ("live holders' files deleted", lambda o: len(o.live_files_deleted)),
    ("workers ended by a fault", lambda o: len(o.worker_exits)),
    ("attempts consumed by outages", lambda o: o.outage_attempts),
    ("attempts consumed by kills and partitions", lambda o: o.extra_attempts - o.outage_attempts),
    (
        "projects not complete with the clean dataset",
        lambda o: int(o.dataset_difference is not None),
    ),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--clips", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write every schedule's outcome here")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    outcomes = []
    started = time.monotonic()
    with FaultLab(workers=args.workers, clips=args.clips) as lab:
        span = lab.reference.work_seconds
        print(
            f"clean run: {span:.1f} s from its first item, {len(lab.reference.dataset['images'])} images"
        )
        for n in range(args.schedules):
            outcome = lab.run(random_schedule(rng, workers=args.workers, span_s=span))
            outcomes.append(outcome)
            verdict = "; ".join(outcome.problems()) or "ok"
            print(
                f"{n + 1:4d} {outcome.work_seconds:6.1f} s  {outcome.schedule.describe()}  -> "
                f"{verdict} (extra attempts {outcome.extra_attempts})",
                flush=True,
            )
            if args.json:  # after each schedule: a run stopped early keeps what it played
                args.json.write_text(json.dumps([record(o) for o in outcomes], indent=1))
    print(f"\n{len(outcomes)} schedules in {time.monotonic() - started:.0f} s (seed {args.seed})\n")
    print(tables(outcomes))


def tables(outcomes: list) -> str:
    injected, schedules, failing = Counter(), Counter(), Counter()
    for outcome in outcomes:
        kinds = [f.kind for f in outcome.schedule.faults]
        injected.update(kinds)
        schedules.update(set(kinds))
        if outcome.problems():
            failing.update(set(kinds))
    lines = [
        "| fault | injected | schedules with it | of them with a problem |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {k} | {injected[k]} | {schedules[k]} | {failing[k]} |" for k in KINDS]
    no_cost = sum(o.schedule.no_cost for o in outcomes)
    lines += [
        "",
        f"| outcome (over {len(outcomes)} schedules, {no_cost} of them only of faults that must cost nothing) | total | schedules |",
        "|---|---:|---:|",
    ]
    for name, count in OUTCOMES:
        counts = [count(o) for o in outcomes]
        lines.append(f"| {name} | {sum(counts)} | {sum(1 for c in counts if c)} |")
    clean = sum(1 for o in outcomes if not o.problems())
    lines.append(f"| schedules with no problem at all | | {clean} |")
    return "\n".join(lines)


def record(outcome) -> dict:
    return {
        "schedule": outcome.schedule.describe(),
        "notes": outcome.notes,
        "problems": outcome.problems(),
        "seconds": round(outcome.work_seconds, 1),
        "extra_attempts": outcome.extra_attempts,
        "spent": outcome.spent,
        "log_tail": outcome.log_tail if outcome.problems() else "",
    }


if __name__ == "__main__":
    main()
