"""A small filesystem that really fills, for tests where a full disk is the point.

    with small_disk(tmp_path / "data", size_mb=4) as data_dir:
        ...                              # writes past 4 MB fail with errno 28 (ENOSPC)
        filler = fill(data_dir)          # or: no space left from the start

A tmpfs is mounted on the directory; where the kernel refuses that, an ext4 image file through a
loop device. Both need root (or CAP_SYS_ADMIN): where neither is permitted, the test is skipped
and says why. The mount is gone when the `with` ends.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(directory: Path, *, size_mb: int) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    image = directory.with_name(f"{directory.name}.ext4")
    refusals = _mount(directory, size_mb, image)
    if refusals:
        image.unlink(missing_ok=True)
        pytest.skip(
            f"no small filesystem could be mounted on {directory} (needs root or "
            f"CAP_SYS_ADMIN): {'; '.join(refusals)}"
        )
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=False, capture_output=True)
        image.unlink(missing_ok=True)


def _mount(directory: Path, size_mb: int, image: Path) -> list[str]:
    """Mount a tmpfs, else an ext4 image, on `directory`: what refused it (nothing: mounted)."""
    tmpfs = _run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(directory)])
    if tmpfs is None:
        return []
    with image.open("wb") as handle:
        handle.truncate(size_mb * 2**20)
    ext4 = _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)]) or _run(
        ["mount", "-o", "loop", str(image), str(directory)]
    )
    return [] if ext4 is None else [tmpfs, ext4]


def fill(directory: Path, *, leave_bytes: int = 0) -> Path:
    """Fill the filesystem of `directory` with one file, leaving about `leave_bytes` free; returns
    the file (delete it to free the space)."""
    filler = filler_of(directory)
    chunk = bytes(64 * 1024)
    with filler.open("wb", buffering=0) as handle:  # unbuffered: nothing is left to flush
        try:
            while True:
                handle.write(chunk)
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
    if leave_bytes:
        size = filler.stat().st_size
        with filler.open("r+b") as handle:
            handle.truncate(max(size - leave_bytes, 0))
    return filler


def filler_of(directory: Path) -> Path:
    """The file `fill` writes in `directory`: there while the disk is kept full."""
    return directory / "filler"


def _run(command: list[str]) -> str | None:
    """None when `command` succeeded, else what it said."""
    if shutil.which(command[0]) is None:
        return f"{command[0]} is not installed"
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    return f"{' '.join(command[:3])}...: {(done.stderr or done.stdout).strip() or done.returncode}"
