"""A pytest plugin for bench/suite.py: each test's CPU in the process that ran it, and when the
session started.

Appends to $DATAMINER_SUITE_ACCOUNTING/tests.jsonl one line per test (node id, xdist worker, the
CPU seconds of the worker process while the test ran its set-up, call and tear-down, and their
wall time), and, from the controller, one line with the time the session started (the end of the
install, for the run's timeline).
"""

from __future__ import annotations

import json
import os
import resource
import time

import pytest


def _append(line: dict) -> None:
    directory = os.environ.get("DATAMINER_SUITE_ACCOUNTING")
    if directory:
        with open(os.path.join(directory, "tests.jsonl"), "a") as out:
            out.write(json.dumps(line) + "\n")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, not an xdist worker
        _append({"session_started": time.time()})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    cpu, wall = _cpu_s(), time.monotonic()
    yield
    _append(
        {
            "test": item.nodeid,
            "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
            "cpu_s": round(_cpu_s() - cpu, 3),
            "wall_s": round(time.monotonic() - wall, 3),
        }
    )
