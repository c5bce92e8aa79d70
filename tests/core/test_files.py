"""Recognising a full disk, whatever raised it; a real one from a small tmpfs."""

from __future__ import annotations

import errno
import os
import stat

import numpy as np
import pytest

from dataminer_dagster.core.files import InsufficientDiskSpace, disk_full
from tests.helpers.small_disk import fill, small_disk


def _raised_from(outer: Exception, inner: BaseException, *, implicitly: bool) -> Exception:
    try:
        try:
            raise inner
        except BaseException as error:
            if implicitly:
                raise outer  # noqa: B904 - the context, as a library's handler leaves it
            raise outer from error
    except Exception as raised:
        return raised


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.ENOSPC, "No space left on device", "/data/frames/x.jpg"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),
        InsufficientDiskSpace("not enough free disk space in /data: 3 MB free, 1,024 MB needed"),
        _raised_from(RuntimeError("writer failed"), OSError(errno.ENOSPC, "full"), implicitly=True),
        _raised_from(
            ValueError("table not written"), OSError(errno.ENOSPC, "full"), implicitly=False
        ),
    ],
)
def test_a_full_disk_is_found_in_the_error_or_its_chain(error):
    found = disk_full(error)
    assert isinstance(found, OSError)
    assert found is error or found is error.__cause__ or found is error.__context__


@pytest.mark.parametrize(
    "error",
    [
        OSError(errno.EACCES, "Permission denied"),
        FileNotFoundError(errno.ENOENT, "No such file or directory"),
        ValueError("no space left on device"),  # words outside an OSError are not a disk
        _raised_from(RuntimeError("x"), PermissionError(errno.EACCES, "denied"), implicitly=True),
    ],
)
def test_other_errors_are_not_a_full_disk(error):
    assert disk_full(error) is None


def test_a_write_to_a_really_full_disk_is_recognised(tmp_path):
    with small_disk(tmp_path / "disk", size_mb=1) as disk:
        fill(disk)
        with pytest.raises(OSError) as raised:
            (disk / "more").write_bytes(bytes(64 * 1024))
    assert disk_full(raised.value) is raised.value


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_coco_files_and_pictures_have_the_mode_of_every_other_output(tmp_path, umask):
    """annotations.coco.json and coco/<split>.json were 0600 where every other output is 0644."""
    from dataminer_dagster.core.coco import write_coco
    from dataminer_dagster.core.visualize import write_png

    old = os.umask(umask)
    try:
        plain = tmp_path / "manifest.txt"
        plain.write_text("x")
        document = {
            "images": [],
            "annotations": [],
            "categories": [{"id": 1, "name": "car", "supercategory": "x"}],
        }
        coco = write_coco(document, tmp_path / "a.json")
        png = write_png(tmp_path / "p.png", np.zeros((2, 2, 3), dtype=np.uint8))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (plain, coco, png)}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask), modes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "manifest.txt", "p.png"]
