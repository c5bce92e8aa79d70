"""What a path is when it is not what a caller needs, in words a user recognises.

A video path that is a named pipe, a device or a directory is named as what it is: opening a FIFO
waits for a writer for ever, /dev/zero never ends, and "file not found" for a directory that is
there sends the user looking in the wrong place. An output directory that is a file is named the
same way. Nothing here opens the path, so nothing blocks.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

_KINDS = (
    (stat.S_ISREG, "a file"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_regular_file(path: str | os.PathLike[str]) -> str | None:
    """None when `path` is a regular file (or a symbolic link to one); else what it is instead,
    e.g. 'file not found', 'a directory, not a regular file', 'a symbolic link loop, ...'."""
    return _unless(path, stat.S_ISREG, "a regular file", missing="file not found")


def not_a_directory(path: str | os.PathLike[str]) -> str | None:
    """None when `path` is a directory (or a symbolic link to one); else what it is instead,
    e.g. 'a character device (a symbolic link to /dev/null), not a directory'."""
    return _unless(path, stat.S_ISDIR, "a directory", missing="not found")


def _unless(
    path: str | os.PathLike[str], is_wanted: Callable[[int], bool], wanted: str, *, missing: str
) -> str | None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"a symbolic link loop (its links lead back to themselves), not {wanted}"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"a broken symbolic link (to {os.readlink(path)}, which does not exist)"
        if exc.errno == errno.ENOENT:
            return missing
        return exc.strerror or str(exc)
    if is_wanted(mode):
        return None
    kind = next((name for is_kind, name in _KINDS if is_kind(mode)), "a special file")
    return f"{kind}{_target(path)}, not {wanted}"


def _target(path: str | os.PathLike[str]) -> str:
    """' (a symbolic link to X)' for a link, else ''."""
    try:
        return f" (a symbolic link to {os.readlink(path)})"
    except OSError:  # not a link
        return ""
