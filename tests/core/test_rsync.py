"""Backups with rsync: what counts as remote, which destinations are refused, and that nothing in a
destination ever reaches a remote shell as code."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dataminer_dagster.config import ConfigError, parse_project_config
from dataminer_dagster.core.rsync import check_dest, copy_tree, is_remote, verify_tree

# Stands in for ssh the way sshd treats the command: the words after the host are joined and run
# by a shell on the "remote" machine (here, this one).
STAND_IN_SSH = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-l|-p) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
shift
exec sh -c "$*"
"""


@pytest.mark.parametrize(
    ("dest", "remote"),
    [
        ("user@host:/backups", True),
        ("host:/backups", True),
        ("host:backups", True),
        ("/srv/backups", False),
        ("./a:b", False),
        ("relative/dir", False),
    ],
)
def test_a_colon_before_any_slash_means_remote_as_for_rsync(dest, remote):
    assert is_remote(dest) is remote


@pytest.mark.parametrize(
    "dest",
    [
        "user@host:/x'; touch /tmp/marker; echo '",
        "host:/x$(reboot)",
        "-oProxyCommand=touch /tmp/marker:/x",
        "user@-host:/x",
        "host:/x y",
        "-e",
    ],
)
def test_a_destination_with_shell_or_option_syntax_is_refused(dest):
    with pytest.raises(ValueError, match="backup.dest"):
        check_dest(dest)


@pytest.mark.parametrize(
    "dest", ["user@backup-1.example.com:/srv/frames", "host:frames", "/srv/backup dir"]
)
def test_ordinary_destinations_are_accepted(dest):
    assert check_dest(dest) == dest


def test_the_project_config_refuses_such_a_destination_and_says_why():
    config = {
        "name": "p",
        "inputs": {"urls": ["https://youtu.be/dQw4w9WgXcQ"]},
        "filter": {"positive_prompts": ["a door"]},
        "backup": {"dest": "user@host:/x'; touch /tmp/marker; echo '"},
    }
    with pytest.raises(ConfigError) as error:
        parse_project_config(config)
    assert "backup.dest" in str(error.value) and "user@host:/path" in str(error.value)


def test_a_remote_destination_never_runs_as_shell_code(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    source = tmp_path / "frames"
    (source / "p").mkdir(parents=True)
    for i in range(3):
        (source / "p" / f"{i}.jpg").write_bytes(bytes([i]) * 10)
    marker = tmp_path / "marker"
    dest = f"user@host:{tmp_path}/backup'; touch {marker}; echo '"

    copy_tree(source, dest)
    assert verify_tree(source, dest) == 3
    assert not marker.exists(), "the destination ran as shell code on the remote side"


def test_a_plain_remote_destination_is_copied_and_counted(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(STAND_IN_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    source = tmp_path / "frames"
    source.mkdir()
    (source / "a.jpg").write_bytes(b"a")
    dest = f"host:{tmp_path}/backup"

    copy_tree(source, dest)
    assert verify_tree(source, dest) == 1
    assert (tmp_path / "backup" / "a.jpg").read_bytes() == b"a"
