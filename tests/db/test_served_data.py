"""One data directory per database (db/served_data.py): a home whose data directory is not the
one its database serves is refused with an error naming both."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dataminer_dagster.resources.db import DatabaseResource


def _paths(database_url: str, data_dir) -> object:
    return DatabaseResource(database_url=database_url, data_dir=str(data_dir)).paths


def test_a_second_home_with_its_own_data_directory_is_refused(database_url, tmp_path):
    first, second = tmp_path / "machine-a" / "data", tmp_path / "machine-b" / "data"
    assert _paths(database_url, first).root == first
    assert _paths(database_url, first).root == first, "the served one, again"
    with pytest.raises(RuntimeError, match="serves the data directory") as refused:
        _paths(database_url, second)
    assert str(first) in str(refused.value) and str(second) in str(refused.value)


def test_another_disk_at_the_same_path_is_refused(database_url, tmp_path):
    """A second machine whose own disk is mounted where the first one's shared storage is: same
    path, other files. Told apart by the marker the served directory holds."""
    data = tmp_path / "data"
    assert _paths(database_url, data).root == data
    (data / "videos").mkdir(parents=True)
    data.rename(tmp_path / "shared-storage")
    data.mkdir()  # the second machine's empty local disk at the same path
    check = (
        "from dataminer_dagster.resources.db import DatabaseResource\n"
        f"DatabaseResource(database_url={database_url!r}, data_dir={str(data)!r}).paths\n"
    )
    other_machine = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, env=os.environ.copy()
    )
    assert other_machine.returncode != 0
    assert "is not that directory" in other_machine.stderr, other_machine.stderr
