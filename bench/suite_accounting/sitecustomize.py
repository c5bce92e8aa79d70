"""Each Python process that the suite starts records its CPU when it exits (bench/suite.py).

On the path (PYTHONPATH) of a suite run, this module is imported at the start of every Python
process that inherits the environment: xdist workers, daemons, code servers, run workers, CLI
calls, pip. At a normal exit it appends one line to $DATAMINER_SUITE_ACCOUNTING/processes.jsonl:
its arguments, its own CPU seconds (children not included), how long it lived, and the test that
was running when it started (PYTEST_CURRENT_TEST, which pytest sets in the worker's environment).
A process killed by a signal runs no exit handler and is not recorded.
"""

import atexit
import json
import os
import sys
import time

_STARTED = time.monotonic()
_DIRECTORY = os.environ.get("DATAMINER_SUITE_ACCOUNTING")


def _record() -> None:
    times = os.times()
    line = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": [os.path.basename(sys.argv[0]) if sys.argv else "", *sys.argv[1:6]],
        "cpu_s": round(times.user + times.system, 3),
        "lived_s": round(time.monotonic() - _STARTED, 3),
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
        "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
    }
    try:
        with open(os.path.join(_DIRECTORY, "processes.jsonl"), "a") as out:
            out.write(json.dumps(line) + "\n")
    except OSError:
        pass


if _DIRECTORY:
    atexit.register(_record)
