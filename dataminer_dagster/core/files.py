"""Atomic publication of files and directories: build in a hidden sibling, then rename into place.

A re-run replaces what was there; a crash leaves either the old output or the new one, plus a
hidden staging directory that the next attempt removes. Work that writes much checks the free
space first (`require_free_space`); a disk that fills all the same is recognised by `disk_full`.
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import uuid
from pathlib import Path

# A write refused for want of space: the disk is full, or the user's quota on it is used up.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# The same, said only in words (an error that keeps the text of the OSError it wraps).
DISK_FULL_WORDS = ("no space left on device", "disk quota exceeded")


class InsufficientDiskSpace(OSError):
    """Too little free disk space for a piece of work, or none left: the disk's state, not the
    work's fault."""


def disk_full(error: BaseException) -> OSError | None:
    """The error of `error`'s chain (itself, its causes and contexts) that says a disk is full:
    an InsufficientDiskSpace, or an OSError with errno ENOSPC or EDQUOT (or only its words, as
    some libraries raise it). None when there is none."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, InsufficientDiskSpace) or (
            isinstance(current, OSError)
            and (current.errno in DISK_FULL_ERRNOS or says_disk_full(str(current)))
        ):
            return current
        pending += [current.__cause__, current.__context__]
    return None


def says_disk_full(text: str) -> bool:
    lowered = text.lower()
    return any(words in lowered for words in DISK_FULL_WORDS)


def require_free_space(directory: Path, needed_bytes: int, purpose: str) -> None:
    """Raise InsufficientDiskSpace unless the filesystem of `directory` has `needed_bytes` free.
    `purpose` says what needs the space and which setting asks for it."""
    free = shutil.disk_usage(directory).free
    if free < needed_bytes:
        raise InsufficientDiskSpace(
            f"not enough free disk space in {directory}: {free / 2**20:,.0f} MB free, "
            f"{needed_bytes / 2**20:,.0f} MB needed for {purpose}"
        )


def write_atomically(path: Path, data: bytes | str) -> Path:
    """Write one file atomically (a hidden sibling, then rename), with the mode every output has:
    0666 less the process's umask, as `open` gives (a temporary file's 0600 would make one output
    of a dataset unreadable to the others who read it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    content = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return path


def staging_path(final: Path) -> Path:
    """A fresh hidden sibling of `final` on the same filesystem (so that rename is atomic).
    Leftovers of an earlier attempt at the same output (killed mid-way) are removed first: one
    output has one writer at a time, its work item's lease holder."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(final)
    return final.parent / f".staging-{final.name}-{uuid.uuid4().hex[:8]}"


def leftovers(final: Path) -> list[Path]:
    """The hidden siblings of `final` that an attempt or a deletion killed mid-way left behind
    (`staging_path`, `set_aside`)."""
    name = glob.escape(final.name)
    return [*final.parent.glob(f".staging-{name}-*"), *final.parent.glob(f".replaced-{name}-*")]


def remove_leftovers(final: Path) -> None:
    """Remove the `leftovers` of `final` (one output has one writer at a time, the lease holder
    of its work item)."""
    for leftover in leftovers(final):
        remove(leftover)


def publish(staged: Path, final: Path) -> None:
    """Move `staged` (file or directory) to `final`, replacing what is there."""
    if staged.is_dir():
        old = set_aside(final) if final.exists() else None
        os.replace(staged, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, final)


def set_aside(path: Path) -> Path:
    """Rename `path` to a hidden sibling, in one step, and return the new name: a directory that is
    to be deleted is gone from its place at once, never left half-deleted there by a crash. The
    next `staging_path` for the same place removes a sibling a crash left behind."""
    aside = path.parent / f".replaced-{path.name}-{uuid.uuid4().hex[:8]}"
    os.replace(path, aside)
    return aside


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def make_read_only(directory: Path) -> None:
    """Take write permission off every file under `directory`. Frames are shared by hard links
    (datasets, exports with --link): an edit in place would change every copy at once. (Root
    can still write; a tool that saves to a new file and renames it leaves the frame alone.)"""
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def link_or_copy(source: Path, target: Path) -> bool:
    """Hard-link `source` to `target`, copying only across devices. Returns True for a link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
        return True
    except OSError:
        shutil.copy2(source, target)
        return False
