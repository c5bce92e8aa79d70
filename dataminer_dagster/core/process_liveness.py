"""Whether the process behind a heartbeat still lives, where this process can look it up.

A run's heartbeat row names the process that sent it (its pid) and the process space that pid
belongs to (`process_space`: this boot of the machine and the pid namespace, so two containers on
one host or two boots of one machine are never confused). A reaper in the same process space can
ask the operating system: a run whose process is gone is dead now, not only after
`leases.stale_after_s` of silence. From anywhere else (another machine, another container) only the
silence tells, and `process_gone` answers False.

`/proc` is trusted only where it belongs to this process's own pid namespace (`/proc/self` names
our pid): a sandbox that gives a process its own pid namespace without its own `/proc` mount would
otherwise look heartbeat pids up among another namespace's processes, and call a live run gone.
Across machines the boot id tells machines apart; a machine cloned from another's image after
boot (a VM snapshot) shares its boot id and pid namespace ids, which docs/deployment.md warns of.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

# A process created later than this after the last heartbeat holds a reused pid: not the sender.
_CREATED_AFTER_BEAT_S = 1.0


@functools.cache
def process_space() -> str | None:
    """This process's process space: the machine's boot id and the pid namespace; None where the
    system does not say (not Linux), and then no heartbeat is judged by its pid."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # this /proc is another pid namespace's: its pids are not ours
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot} {namespace}"


def process_gone(pid: int, space: str | None, *, beat_age_s: float) -> bool:
    """True when process `pid` of process space `space`, which sent a heartbeat `beat_age_s`
    seconds ago, no longer exists: no such process, a zombie, or a process created after that
    beat (the pid was reused). False when it lives or when it is not ours to look up."""
    if space is None or space != process_space():
        return False
    import psutil

    try:
        process = psutil.Process(pid)
        created, status = process.create_time(), process.status()
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:  # another user's process: alive, as far as we may tell
        return False
    last_beat = time.time() - beat_age_s
    return status == psutil.STATUS_ZOMBIE or created > last_beat + _CREATED_AFTER_BEAT_S
