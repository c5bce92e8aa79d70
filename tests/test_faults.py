"""Fault schedules on simulated machines: `dataminer run` on two worker machines (network and pid
namespaces) against a scratch PostgreSQL 15 reached over veth pairs, with short leases, while a
nemesis partitions a machine, stops the database (`pg_ctl stop -m fast`, `-m immediate`) and starts
it again, cuts a COMMIT's answer off, runs a machine with its clock off, kills a machine and fills
the data disk or the database's (tests/helpers/faults.py). After each schedule the checker
(tests/helpers/fault_checks.py) reads the database and the disk: nothing lost, every file as the
database records it, no live holder's files deleted, no worker ended by a fault, no attempt spent on
a fault that must cost none, and the clean run's dataset. bench/faults.py plays hundreds of random
schedules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.fault_checks import (
    Outcome,
    files_against_records,
    leftovers,
    live_files_deleted,
)
from tests.helpers.fault_machines import missing_requirements
from tests.helpers.faults import Fault, FaultLab, Schedule

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("faults"), pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def lab():
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    with FaultLab(workers=2, clips=2) as lab:
        yield lab


def test_the_checker_sees_files_out_of_step_with_the_database(tmp_path: Path):
    """The checks the schedules rest on can fail: a recorded frames folder gone, an unrecorded
    one left, a staging sibling, a set-aside sibling in a project's output."""
    data = tmp_path / "data"
    for folder in ("frames/v1/p", "frames/v2/p", "frames/v3/.staging-p-1234", "videos"):
        (data / folder).mkdir(parents=True)
    (data / "videos" / "v1.mp4").write_bytes(b"")
    (data / "videos" / "v9.mp4").write_bytes(b"")
    recorded = {"frames/v1/p", "frames/v4/p"}
    missing, unrecorded = files_against_records(data, recorded, {"videos/v1.mp4"})
    assert missing == ["frames/v4/p"]
    assert unrecorded == ["frames/v2/p", "frames/v3/.staging-p-1234", "videos/v9.mp4"]
    (tmp_path / "out" / "dataset").mkdir(parents=True)
    (tmp_path / "out" / ".replaced-dataset-abcd").mkdir()
    assert [p.name for p in leftovers(tmp_path / "out")] == [".replaced-dataset-abcd"]


def test_the_checker_counts_vanished_files_of_live_leases_only():
    """A staging folder that vanished under a worker holding its lease counts; one removed by the
    next holder after the worker's lease was taken back, which the worker then reports as failed
    after its lease was lost, does not; without the next holder's word it still counts."""
    staging = "/d/videos/.staging-s00-7cef-fe2ca1d6-be19d8de"
    live = (
        f"download s00-7cef failed on attempt 1: [Errno 2] No such file or directory: '{staging}'"
    )
    fenced = (
        "download s00-7cef: failed after its lease was lost: "
        f"[Errno 2] No such file or directory: '{staging[:30]}"
    )
    removed = f"removed {staging}, left by a worker whose lease is dead"
    other = "/d/videos/.staging-s01-95d2-e7be-c84a"
    unexplained = (
        "download s01-95d2: failed after its lease was lost: "
        f"[Errno 2] No such file or directory: '{other}'"
    )
    assert live_files_deleted([fenced, removed]) == []
    assert live_files_deleted([live, removed]) == [live]
    assert live_files_deleted([fenced]) == [fenced]
    assert live_files_deleted([unexplained, removed]) == [unexplained]


def test_attempts_count_against_the_clean_run_only_where_faults_must_cost_none():
    def outcome(*faults: Fault) -> Outcome:
        spent = ["frames v1: 3 attempts (clean run 1), last error: gone"]
        return Outcome(
            Schedule(faults), "complete", [], [], [], [], [], {}, 2, {}, None, spent=spent
        )

    assert outcome(Fault("db_stop_fast", 1, 5)).problems() == [
        "2 attempts consumed by faults that must cost none: "
        "frames v1: 3 attempts (clean run 1), last error: gone"
    ]
    assert outcome(Fault("db_stop_fast", 1, 5), Fault("sigkill", 2, 1)).problems() == []


# What today's code survives: a machine killed and started again, another with its clock 150 s
# behind, the data disk full. One schedule, so that the suite pays for the machines' start once.
WORKER_FAULTS = Schedule(
    (
        Fault("clock_offset", at_s=0, lasts_s=12, worker=1, offset_s=-150),
        Fault("sigkill", at_s=1, lasts_s=2, worker=0),
        Fault("disk_full", at_s=4, lasts_s=3),
    )
)
# The database out of a worker's reach: stopped fast, a backend terminated at COMMIT, a machine cut
# off for longer than a lease, its disk full (reads go through, writes do not) and meanwhile stopped
# immediate, started again only once its disk has room (it cannot start on a full one).
DATABASE_OUTAGES = Schedule(
    (
        Fault("db_stop_fast", at_s=1, lasts_s=5),
        Fault("commit_cut", at_s=7, lasts_s=1, worker=0),
        Fault("partition", at_s=8, lasts_s=5, worker=1),
        Fault("db_disk_full", at_s=14, lasts_s=8),
        Fault("db_stop_immediate", at_s=15, lasts_s=2),
    )
)


def test_killed_and_clock_stepped_machines_and_a_full_disk_lose_nothing(lab):
    outcome = lab.run(WORKER_FAULTS)
    assert not outcome.problems(), outcome.report()


def test_a_database_out_of_reach_for_a_while_costs_nothing(lab):
    outcome = lab.run(DATABASE_OUTAGES)
    assert not outcome.problems(), outcome.report()
