"""The machines of a fault lab (tests/helpers/faults.py): worker machines in network namespaces
joined to the root namespace by veth pairs, a scratch PostgreSQL 15 cluster listening on the lab's
service address, and `dataminer run` on a machine in a pid namespace of its own.

The root namespace is the end of every veth pair (10.B.i.2 inside machine i, 10.B.i.1 outside, a
default route through it) and owns the service address (10.B.0.1/32 on the loopback), so packets
are delivered locally and never forwarded: no sysctl (`net.ipv4.ip_forward` may stay 0) and no
bridge are needed, only iproute2, the veth driver, util-linux's `unshare` and root
(CAP_NET_ADMIN, CAP_SYS_ADMIN). Taking the outside end of a pair down partitions its machine: its
packets are dropped, its connections stall until their timeouts, as across a broken network.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_BIN = Path("/usr/lib/postgresql/15/bin")
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Fenced)\b[^:]*: ")


def missing_requirements() -> str | None:
    """Why fault schedules cannot run here, or None."""
    if os.geteuid() != 0:
        return "fault schedules need root (network namespaces, mounts, a cluster run as postgres)"
    for tool in ("ip", "unshare", "runuser", "mount"):
        if shutil.which(tool) is None:
            return f"fault schedules need `{tool}` (iproute2 / util-linux), which is not installed"
    if not (PG_BIN / "pg_ctl").is_file():
        return f"fault schedules need PostgreSQL 15's server binaries in {PG_BIN}"
    probe = f"dmfprobe{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    ip("netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is refused here: {made.stderr.strip()}"
    return None


def run_command(
    *command: str, check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {(done.stderr or done.stdout).strip()}")
    return done


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run_command("ip", *args, check=check)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


class Network:
    """The service address and one namespace per worker machine. Names carry this process's pid,
    so that a lab whose process died is swept by the next one (`sweep_abandoned`)."""

    PREFIX = "dmf"

    def __init__(self, workers: int):
        self.tag = f"{self.PREFIX}{os.getpid()}"
        self.sweep_abandoned()
        self.octet = self._free_octet()
        self.service_address = f"10.{self.octet}.0.1"
        self.namespaces: list[str] = []
        ip("addr", "add", f"{self.service_address}/32", "dev", "lo", "label", f"lo:{self.tag}")
        try:
            for i in range(workers):
                self._add_machine(i)
        except BaseException:
            self.close()
            raise

    def _free_octet(self) -> int:
        used = ip("-o", "addr").stdout + ip("route").stdout
        for octet in random.sample(range(100, 250), 150):
            if f" 10.{octet}." not in used and f"\n10.{octet}." not in used:
                return octet
        raise RuntimeError("no free 10.B.0.0/16 network for the fault lab")

    def host_link(self, worker: int) -> str:
        return f"{self.tag}h{worker}"

    def namespace(self, worker: int) -> str:
        return f"{self.tag}w{worker}"

    def worker_address(self, worker: int) -> str:
        return f"10.{self.octet}.{worker + 1}.2"

    def _add_machine(self, i: int) -> None:
        ns, link, net = self.namespace(i), self.host_link(i), f"10.{self.octet}.{i + 1}"
        ip("netns", "add", ns)
        self.namespaces.append(ns)
        ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("addr", "add", f"{net}.1/24", "dev", link)
        ip("link", "set", link, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{net}.2/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")
        ip("-n", ns, "route", "add", "default", "via", f"{net}.1")

    def partition(self, worker: int) -> None:
        ip("link", "set", self.host_link(worker), "down")

    def heal(self, worker: int) -> None:
        ip("link", "set", self.host_link(worker), "up")

    def close(self) -> None:
        for ns in self.namespaces:  # deleting a namespace deletes its veth pair
            ip("netns", "del", ns, check=False)
        self.namespaces = []
        ip("addr", "del", f"{self.service_address}/32", "dev", "lo", check=False)

    @classmethod
    def sweep_abandoned(cls) -> None:
        """Remove the namespaces and addresses of labs whose process is gone."""
        for line in ip("netns", "list").stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            owner = name[len(cls.PREFIX) :].split("w")[0]
            if name.startswith(cls.PREFIX) and owner.isdigit() and not _alive(int(owner)):
                ip("netns", "del", name, check=False)
        for line in ip("-o", "-4", "addr", "show", "dev", "lo").stdout.splitlines():
            parts = line.replace("\\", " ").split()  # `ip -o` ends each line's fields with "\\"
            labels = [p for p in parts if p.startswith(f"lo:{cls.PREFIX}")]
            owner = labels[0].removeprefix(f"lo:{cls.PREFIX}") if labels else ""
            if owner.isdigit() and not _alive(int(owner)):
                address = parts[parts.index("inet") + 1]
                ip("addr", "del", address, "dev", "lo", check=False)


class ScratchCluster:
    """A PostgreSQL 15 cluster of its own, listening on the service address (and a private Unix
    socket), that the nemesis may stop, start and reconfigure. Its trials' databases live in a
    tablespace on a small disk of their own (`disk`, a tmpfs), which the nemesis may fill: the
    database's disk full (writes that need room fail with SQLSTATE 53100) while its WAL, on
    the cluster's own disk, goes on."""

    TEMPLATE = "dm_faults_template"
    TABLESPACE = "dm_faults_disk"
    DISK_MB = 64

    def __init__(self, root: Path, address: str):
        self.data = self.data_dir(root)
        self.disk = self.disk_dir(root)
        self.socket_dir = root / "pgsock"
        self.log = self.socket_dir / "postgres.log"  # where the postgres user may write
        self.address = address
        self.port = 5432  # free on this address: the address is the lab's own
        for path in (self.data, self.socket_dir, self.disk):
            path.mkdir(mode=0o700)
        run_command("mount", "-t", "tmpfs", "-o", f"size={self.DISK_MB}m", "tmpfs", str(self.disk))
        for path in (self.data, self.socket_dir, self.disk):
            path.chmod(0o700)
            shutil.chown(path, "postgres", "postgres")
        self._as_postgres(
            PG_BIN / "initdb",
            "-D",
            self.data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '{address}'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                "fsync = off\nshared_buffers = 32MB\nmax_connections = 200\n"
                "log_min_messages = warning\n"
            )
        with (self.data / "pg_hba.conf").open("a") as hba:
            network = ".".join(address.split(".")[:2])
            hba.write(f"host all all {network}.0.0/16 trust\n")  # the lab's machines
        self.start()

    @staticmethod
    def data_dir(root: Path) -> Path:
        return root / "pgdata"

    @staticmethod
    def disk_dir(root: Path) -> Path:
        return root / "dbdisk"

    @classmethod
    def stop_abandoned(cls, root: Path) -> None:
        """Stop the cluster of a lab whose process died."""
        run_command(
            "runuser", "-u", "postgres", "--",
            str(PG_BIN / "pg_ctl"), "-D", str(cls.data_dir(root)), "-m", "immediate", "stop",
            check=False,
        )  # fmt: skip

    def _as_postgres(self, *command, check: bool = True) -> subprocess.CompletedProcess:
        return run_command(
            "runuser", "-u", "postgres", "--", *map(str, command), check=check, timeout=120
        )

    def start(self) -> None:
        if self.running():  # an earlier fault's healing started it already
            return
        self._as_postgres(
            PG_BIN / "pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", "start"
        )

    def stop(self, mode: str) -> None:
        self._as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop", check=False)

    def running(self) -> bool:
        status = self._as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "status", check=False)
        return status.returncode == 0

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}:{self.port}/{database}"

    def engine(self, database: str = "postgres") -> sa.Engine:
        """An engine of its own (no pool) in autocommit, for CREATE DATABASE and ALTER SYSTEM."""
        return sa.create_engine(
            self.url(database).replace("postgresql://", "postgresql+psycopg://"),
            isolation_level="AUTOCOMMIT",
            poolclass=sa.pool.NullPool,
            connect_args={"connect_timeout": 5},
        )

    def admin(self, statement: str, database: str = "postgres", **params) -> list[sa.Row]:
        """One statement in autocommit, its rows."""
        engine = self.engine(database)
        try:
            with engine.connect() as c:
                result = c.execute(sa.text(statement), params)
                return result.all() if result.returns_rows else []
        finally:
            engine.dispose()

    def migrate_template(self) -> None:
        self.admin(f"CREATE TABLESPACE {self.TABLESPACE} LOCATION '{self.disk}'")
        self.admin(f"CREATE DATABASE {self.TEMPLATE}")
        from dataminer_dagster.db import migrate
        from dataminer_dagster.db.engine import dispose_engines, get_engine

        migrate.ensure_schema(get_engine(self.url(self.TEMPLATE)))
        dispose_engines()

    def new_database(self, name: str) -> str:
        self.admin(f"CREATE DATABASE {name} TEMPLATE {self.TEMPLATE} TABLESPACE {self.TABLESPACE}")
        return self.url(name)

    def drop(self, name: str) -> None:
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def cut_commit(self, client_address: str, window_s: float) -> str:
        """Terminate a backend of `client_address` while it waits at COMMIT: for a moment every
        commit waits for a synchronous standby that does not exist, so the one caught has
        committed locally and its client loses the connection without the answer (a COMMIT whose
        outcome is unknown). Returns what happened, for the schedule's notes."""
        engine = self.engine()
        try:
            with engine.connect() as c:
                c.execute(sa.text("ALTER SYSTEM SET synchronous_standby_names = 'nemesis'"))
                try:
                    c.execute(sa.text("SELECT pg_reload_conf()"))
                    return self._catch_commit(c, client_address, window_s)
                finally:
                    c.execute(sa.text("ALTER SYSTEM RESET synchronous_standby_names"))
                    c.execute(sa.text("SELECT pg_reload_conf()"))
        except sa.exc.OperationalError as error:
            return f"the database could not be reached ({str(error).splitlines()[0][:120]})"
        finally:
            engine.dispose()

    @staticmethod
    def _catch_commit(c: sa.Connection, client_address: str, window_s: float) -> str:
        deadline = time.monotonic() + window_s
        while time.monotonic() < deadline:
            caught = c.execute(
                sa.text(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE wait_event = 'SyncRep' AND host(client_addr) = :a"
                ),
                {"a": client_address},
            ).all()
            if caught:
                return f"cut {len(caught)} COMMIT(s) of {client_address}"
            time.sleep(0.01)
        return f"no COMMIT of {client_address} within {window_s:g} s"

    def close(self) -> None:
        self.stop("immediate")
        run_command("umount", "--lazy", str(self.disk), check=False)


class Worker:
    """`dataminer run` on one worker machine: its network namespace and its own pid namespace
    (`--kill-child`: when the outer process dies, everything in the machine dies with it)."""

    def __init__(self, index: int, namespace: str, env: dict[str, str], config: Path, log: Path):
        self.index, self.namespace, self.env = index, namespace, env
        self.config, self.log = config, log
        self.process: subprocess.Popen | None = None
        self.killed_by_nemesis = False
        self.finished = False  # exited 0: the project is finished as far as it is concerned
        self.gave_up = False
        self.restarts = 0
        self.restart_at: float | None = None
        self.exits: list[str] = []  # exits the nemesis did not cause

    def start(self) -> None:
        command = [
            "ip", "netns", "exec", self.namespace,
            "unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
            str(BIN / "dataminer"), "run", str(self.config), "--no-progress",
        ]  # fmt: skip
        with self.log.open("a") as log:
            log.write(f"=== start {time.strftime('%H:%M:%S')}\n")
            log.flush()
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.killed_by_nemesis = False
        self.restart_at = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)

    def last_error(self) -> str:
        """The last line of its log that names an exception (else its last line): why it ended."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if EXCEPTION_LINE.match(line)]
        return (errors or lines or ["(no output)"])[-1][:300]
