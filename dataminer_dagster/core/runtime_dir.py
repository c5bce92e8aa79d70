"""A folder in the temporary directory that only one user may enter, for Unix sockets.

A Unix socket path is limited to about 107 bytes, so a socket cannot always live next to the data
it serves (a deep DATAMINER_HOME). The temporary directory is shared by every local user: a socket
there under a predictable name can be reached, or taken first, by any of them. So sockets go to
`<tmp>/dataminer-<uid>/<name>/`, each folder made with mode 0700 and checked on every use; a folder
that someone else made first is refused, never used.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def private_runtime_dir(name: str, *, owner_uid: int | None = None) -> Path:
    """`<tmp>/dataminer-<uid>/<name>`, made if missing; PermissionError unless both folders
    belong to `owner_uid` (default: this process's user) and no one else may enter them.

    Only root may name another owner (it makes the folders for a server that runs as its own
    system user)."""
    uid = os.geteuid() if owner_uid is None else owner_uid
    base = _private_folder(Path(tempfile.gettempdir()) / f"dataminer-{uid}", uid)
    return _private_folder(base / name, uid)


def _private_folder(path: Path, uid: int) -> Path:
    try:
        path.mkdir(mode=0o700)
        if uid != os.geteuid():
            os.chown(path, uid, -1)
    except FileExistsError:
        pass
    info = path.lstat()  # a symbolic link planted there is refused, not followed
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o077:
        raise PermissionError(
            f"{path} is not a private folder of user {uid} (owner {info.st_uid}, mode "
            f"{stat.filemode(info.st_mode)}); someone else may have made it: remove it, or set "
            "TMPDIR to a directory of your own"
        )
    return path
