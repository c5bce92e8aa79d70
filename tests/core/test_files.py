"""Recognising a full disk, whatever raised it; a real one from a small tmpfs. Hidden siblings
named with their lease token, removed only once that lease is dead."""

from __future__ import annotations

import errno
import os
import stat
import uuid

import numpy as np
import pytest

from dataminer_dagster.core.files import (
    InsufficientDiskSpace,
    disk_full,
    leftovers,
    remove_leftovers,
    set_aside,
    staging_path,
)
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


def test_a_leftover_is_removed_only_once_its_lease_is_dead(tmp_path):
    final = tmp_path / "frames" / "v0" / "profile"
    live, dead = uuid.uuid4().hex, uuid.uuid4().hex
    holders = staging_path(final, live)  # a live holder's staging, and what its publish set aside
    holders.mkdir()
    final.mkdir()
    aside = set_aside(final, live)
    dead_staging = staging_path(final, dead, live=lambda tokens: {live} & set(tokens))
    dead_staging.mkdir()
    unleased = final.parent / f".staging-{final.name}-0badf00d"  # a writer without a lease
    unleased.mkdir()
    neighbour = staging_path(final.parent / f"{final.name}-2", dead)  # another output's
    neighbour.mkdir()
    assert live in holders.name and live in aside.name and dead in dead_staging.name
    assert leftovers(final) == {aside: live, holders: live, dead_staging: dead, unleased: None}

    asked: list[set[str]] = []

    def live_tokens(tokens):
        asked.append(set(tokens))
        return {live} & set(tokens)

    assert sorted(remove_leftovers(final, live_tokens)) == sorted([dead_staging, unleased])
    assert asked == [{live, dead}]
    assert holders.is_dir() and aside.is_dir() and neighbour.is_dir()

    assert sorted(remove_leftovers(final)) == sorted([aside, holders]), "no lease: every one"
    assert neighbour.is_dir()


def test_a_lease_token_is_32_hex_digits(tmp_path):
    with pytest.raises(ValueError, match="32 hex digits"):
        staging_path(tmp_path / "out", "run-1")
