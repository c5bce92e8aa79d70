"""Publication of files and directories: build in a hidden sibling, then rename into place.

A file is one rename, atomic: a reader sees the old file or the new one. A folder is two renames
(the old one set aside, the new one moved in): for an instant there is none, and a crash between
the two leaves none until the next attempt. A re-run replaces what was there; a crash leaves the
old output or the new one (or, for a folder, none), plus a hidden sibling (a staging path, or an
old output set aside) that a later writer removes. Work that writes much checks the free space
first (`require_free_space`); a disk that fills all the same is recognised by `disk_full`.

An output a work item's lease guards has one writer at a time, the holder, but a worker may lose
its lease without knowing it yet (a partition, a paused machine). So the hidden siblings it makes
carry its lease token (`.staging-<name>-<token>-<random>`, `.replaced-<name>-<token>-<random>`),
and a leftover is removed only once its token's lease is no longer live: `remove_leftovers` asks
the caller's `LiveTokens` (the database's answer), never guesses. A token once dead stays dead, so
a leftover found dead may be removed by anyone, at any time after.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

# A write refused for want of space: the disk is full, or the user's quota on it is used up.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# The same, said only in words (an error that keeps the text of the OSError it wraps).
DISK_FULL_WORDS = ("no space left on device", "disk quota exceeded")

# Given lease tokens (hex), the ones whose leases are live now: the database's answer, passed in.
LiveTokens = Callable[[Collection[str]], Collection[str]]


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


def staging_path(final: Path, token: str | None = None, live: LiveTokens | None = None) -> Path:
    """A fresh hidden sibling of `final` on the same filesystem (so that rename is atomic), named
    with `token`, the lease (hex) under which it is written. The `leftovers` of `final` whose
    lease is no longer live by `live` are removed first; without `live` (an output no lease guards,
    such as a command's export) every leftover is taken for a dead writer's."""
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(final, live)
    return final.parent / _hidden_name("staging", final.name, token)


def leftovers(final: Path) -> dict[Path, str | None]:
    """The hidden siblings of `final` that writers left there (`staging_path`, `set_aside`), each
    with the lease token (hex) its name carries (None: a writer without a lease): those of
    attempts killed mid-way, and those still being written."""
    if not final.parent.is_dir():
        return {}
    pattern = re.compile(
        rf"\.(?:staging|replaced)-{re.escape(final.name)}(?:-(?P<token>[0-9a-f]{{32}}))?-[0-9a-f]{{8}}"
    )
    found = {}
    for path in sorted(final.parent.iterdir()):
        if match := pattern.fullmatch(path.name):
            found[path] = match.group("token")
    return found


def remove_leftovers(final: Path, live: LiveTokens | None = None) -> list[Path]:
    """Remove the `leftovers` of `final` whose lease is no longer live by `live` (every one
    without it), and return them. A live holder's staging or set-aside stays: it may be
    publishing. The leftovers are listed before `live` is asked, so one made after the question
    (a new holder's) is never among those removed. `live` is asked even when there is none (it
    may raise, for a caller whose own lease is gone)."""
    found = leftovers(final)
    tokens = {token for token in found.values() if token is not None}
    alive = set(live(tokens)) if live is not None else set()
    dead = [path for path, token in found.items() if token not in alive]
    for path in dead:
        remove(path)
    return dead


def publish(staged: Path, final: Path) -> None:
    """Move `staged` (file or directory) to `final`, replacing what is there. For an output no
    lease guards (a command's export); a stage publishes in its completion
    (db/file_changes.py), which checks its lease."""
    if staged.is_dir():
        old = set_aside(final) if final.exists() else None
        os.replace(staged, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, final)


def set_aside(path: Path, token: str | None = None) -> Path:
    """Rename `path` to a hidden sibling named with `token` (the lease it is set aside under), in
    one step, and return the new name: a directory that is to be deleted is gone from its place at
    once, never left half-deleted there by a crash. A later writer of the same place removes a
    sibling a crash left behind once its lease is no longer live (`remove_leftovers`)."""
    aside = path.parent / _hidden_name("replaced", path.name, token)
    os.replace(path, aside)
    return aside


def _hidden_name(kind: str, name: str, token: str | None) -> str:
    if token is not None and not re.fullmatch(r"[0-9a-f]{32}", token):
        raise ValueError(f"a lease token is 32 hex digits, not {token!r}")
    return f".{kind}-{name}{'' if token is None else f'-{token}'}-{uuid.uuid4().hex[:8]}"


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
