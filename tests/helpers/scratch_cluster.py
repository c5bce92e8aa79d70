"""A PostgreSQL cluster of the test's own, made with the system's `initdb` and driven with
`pg_ctl`, so that a test can stop it the ways a real server goes away (`pg_ctl stop -m fast`: an
orderly shutdown that ends every session; `-m immediate`: a crash, recovered from at the next
start) and start it again on the same port.

    with scratch_cluster() as cluster:
        url = cluster.new_database()
        cluster.stop("immediate"); cluster.start()

It listens on 127.0.0.1 on a free port, trusts local connections, and runs as the `postgres`
system user (initdb refuses root). Where the binaries or that user are missing, the test is
skipped and says why.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.helpers.ports import unused_port

_USER = "postgres"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


class ScratchCluster:
    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            pytest.skip("no PostgreSQL binaries (initdb, pg_ctl) on this machine")
        try:
            user = pwd.getpwnam(_USER)
        except KeyError:
            pytest.skip(f"no {_USER} system user to run a scratch PostgreSQL cluster as")
        if os.geteuid() != 0 and os.geteuid() != user.pw_uid:
            pytest.skip(f"a scratch PostgreSQL cluster runs as {_USER}: needs root or that user")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="dataminer-test-cluster-"))
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self.pgdata = self.root / "pgdata"
        self.port = unused_port()
        self._pg("initdb", "-D", str(self.pgdata), "-A", "trust", "-U", _USER, "--no-sync")
        self.start()

    def _pg(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [str(self.bin / program), *args],
            user=_USER,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed: {done.stderr or done.stdout}")

    def start(self) -> None:
        # No fsync: an `immediate` stop kills the server, not the machine, so what the server
        # wrote is in the page cache and a commit that returned is there after the restart.
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = self.root / "server.log"
        pgdata = str(self.pgdata)
        try:
            self._pg(
                "pg_ctl", "start", "-w", "-t", "60", "-D", pgdata, "-o", options, "-l", str(log)
            )
        except RuntimeError as error:
            said = log.read_text(errors="replace") if log.exists() else "(no server log)"
            raise RuntimeError(f"{error}\nthe server's log ends:\n{said[-3000:]}") from None

    def stop(self, mode: str = "fast") -> None:
        """`fast`: sessions are ended and the server shuts down cleanly; `immediate`: it stops at
        once, as in a crash (the next start recovers)."""
        self._pg("pg_ctl", "stop", "-w", "-t", "60", "-D", str(self.pgdata), "-m", mode)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{_USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database."""
        name = f"dm_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return self.url(name)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def scratch_cluster() -> Iterator[ScratchCluster]:
    cluster = ScratchCluster()
    try:
        yield cluster
    finally:
        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()
        cluster.close()
