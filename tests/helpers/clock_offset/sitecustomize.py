"""A worker machine whose clock is off: Python's wall clock (`time.time`, `time.time_ns`) shifted by
the seconds written in the file $DATAMINER_FAULTS_CLOCK_FILE, read again at most every half second,
in every process started with this directory first on PYTHONPATH (tests/helpers/faults.py). The
nemesis writes an offset into the file and later a 0, as a clock stepped away and back. What the
database judges is on its own clock, so nothing a worker decides about leases may change with it.

Monotonic time is left alone, as an NTP step leaves it. libfaketime is not used: its 0.9.10 (Debian
12) hangs Python's timed waits on a condition variable (`threading.Event.wait(0.2)` never returns)
unless monotonic time is shifted too. `datetime.now()` is not shifted (CPython reads the clock in C).
"""

import os
import time

_file = os.environ.get("DATAMINER_FAULTS_CLOCK_FILE")
_real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
_offset_s, _read_at = 0.0, -1.0


def _offset() -> float:
    global _offset_s, _read_at
    now = _monotonic()
    if _file and now - _read_at > 0.5:
        _read_at = now
        try:
            with open(_file) as handle:
                _offset_s = float(handle.read().strip() or 0)
        except (OSError, ValueError):
            pass
    return _offset_s


time.time = lambda: _real_time() + _offset()
time.time_ns = lambda: _real_time_ns() + int(_offset() * 1e9)
