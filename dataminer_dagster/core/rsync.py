"""Copying a directory with rsync and proving the copy is complete (checksums, file counts).

A destination is a local directory or `[user@]host:/path` (rsync over ssh, key-based, no prompts).
Nothing runs through a shell: rsync itself lists a remote destination, and `check_dest` refuses
destinations that a remote shell or ssh's option parser would read as more than a path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

SSH = "ssh -o BatchMode=yes -o ConnectTimeout=30"


class BackupError(RuntimeError):
    pass


# user and host as ssh takes them (never an option), and a path without spaces or shell syntax.
_REMOTE = re.compile(
    r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*@)?[A-Za-z0-9_][A-Za-z0-9._-]*:[A-Za-z0-9._~/+=,@%-]+"
)


def is_remote(dest: str) -> bool:
    """As rsync reads a destination: remote when a colon comes before any slash."""
    head = dest.split(":", 1)[0]
    return ":" in dest and "/" not in head


def check_dest(dest: str) -> str:
    """`dest` unchanged, or ValueError when rsync or a remote shell could read it as more than a
    place to copy to."""
    if dest.startswith("-") or not dest.strip():
        raise ValueError(
            f"backup.dest {dest!r} must name a directory, and not start with '-' (an rsync option)"
        )
    if is_remote(dest) and not _REMOTE.fullmatch(dest):
        raise ValueError(
            f"backup.dest {dest!r} is not a user@host:/path rsync destination: user and host may "
            "hold letters, digits, '.', '_' and '-' (not first), the path letters, digits and "
            "._~/+=,@%- only (no spaces, quotes or other shell characters)"
        )
    return dest


def copy_tree(source: Path, dest: str, *, timeout_s: float = 3600) -> None:
    """rsync `source/` into `dest/` (created if missing), comparing by checksum."""
    _rsync(["--checksum", "--mkpath", f"{source}/", f"{dest.rstrip('/')}/"], timeout_s)


def verify_tree(source: Path, dest: str, *, timeout_s: float = 1800) -> int:
    """Raise BackupError unless `dest` holds exactly the files of `source` with the same content.
    Returns the number of files checked."""
    listing = _rsync(
        ["--checksum", "--dry-run", "--itemize-changes", f"{source}/", f"{dest.rstrip('/')}/"],
        timeout_s,
    )
    changed = [line for line in listing.splitlines() if line and not line.startswith(".d")]
    if changed:
        raise BackupError(
            f"backup of {source} to {dest} differs in {len(changed)} entries, e.g. {changed[0]!r}"
        )
    local = sum(1 for p in source.rglob("*") if p.is_file())
    remote = _count_files(dest, timeout_s)
    if remote < local:
        raise BackupError(f"backup of {source} to {dest} has {remote} files, the source {local}")
    return local


def _count_files(dest: str, timeout_s: float) -> int:
    listing = _rsync(["--list-only", f"{dest.rstrip('/')}/"], timeout_s)
    return sum(1 for line in listing.splitlines() if line.startswith("-"))


def _rsync(args: list[str], timeout_s: float) -> str:
    binary = shutil.which("rsync")
    if binary is None:
        raise BackupError("rsync is not installed on this machine (apt install rsync)")
    command = [binary, "-a", *args]
    if any(is_remote(a) for a in args):
        command[2:2] = ["-e", SSH]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise BackupError(f"rsync timed out after {timeout_s:.0f} s") from exc
    if result.returncode != 0:
        raise BackupError(f"rsync failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return result.stdout
