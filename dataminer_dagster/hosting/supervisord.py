"""`dataminer services`: dagster-webserver, dagster-daemon and Celery workers under supervisord.

Each DATAMINER_HOME gets its own supervisord (configuration, Unix socket, pidfile and logs under
`$DATAMINER_HOME/services/`): no /etc, no sudo, and a second home never overwrites the first. The pure part builds the configuration text from `ServicesOptions`; the
`Supervisor` class drives the running supervisord over its XML-RPC socket.

Supervisord's configuration syntax expands `%(name)s`, so every literal value written into it goes
through `_literal` (a database password may well contain `%`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dataminer_dagster.core.runtime_dir import private_runtime_dir
from dataminer_dagster.settings import EXECUTORS, Settings, executor_name, load_settings

DEFAULT_QUEUE = "dagster"
GPU_QUEUE = "gpu"
# Variables passed from the environment of `setup` to every program (tunables, model caches).
PASSTHROUGH_PREFIXES = ("DATAMINER_", "DAGSTER_", "HF_")
# A Unix socket path is limited to 108 bytes including the terminating NUL, and supervisord
# binds a temporary name (the path plus "." and its pid) before renaming it: keep well below.
MAX_SOCKET_PATH = 90


class ServicesError(Exception):
    """Something the user can fix (missing file, missing executable, bad value)."""


@dataclass(frozen=True)
class ServicesPaths:
    """Where the services of one DATAMINER_HOME keep their files."""

    home: Path

    @property
    def services_dir(self) -> Path:
        return self.home / "services"

    @property
    def config(self) -> Path:
        return self.services_dir / "supervisord.conf"

    @property
    def socket(self) -> Path:
        """In the services directory, or, when that path is too long for a Unix socket, in a
        private folder of the user in the temporary directory, named after the home (the same
        for every command)."""
        inside = self.services_dir / "supervisor.sock"
        if len(str(inside)) <= MAX_SOCKET_PATH:
            return inside
        digest = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:16]
        try:
            return private_runtime_dir(f"supervisor-{digest}") / "supervisor.sock"
        except PermissionError as exc:
            raise ServicesError(str(exc)) from None

    @property
    def pidfile(self) -> Path:
        return self.services_dir / "supervisord.pid"

    @property
    def log_dir(self) -> Path:
        return self.services_dir / "logs"

    @property
    def celery_config(self) -> Path:
        return self.services_dir / "celery.yaml"


@dataclass(frozen=True)
class ServicesOptions:
    """Everything the supervisord configuration depends on."""

    home: Path  # DATAMINER_HOME: one supervisord per home
    project_dir: Path  # working directory of every program; holds workspace.yaml
    dagster_home: Path
    bin_dir: Path  # where dagster-webserver, dagster-daemon, dagster-celery, supervisord live
    env: Mapping[str, str] = field(default_factory=dict)  # extra variables for every program
    host: str = "127.0.0.1"
    port: int = 3000
    executor: str = EXECUTORS[0]
    workers: int = 1  # Celery workers on the default `dagster` queue
    gpu_workers: int = 1  # Celery workers on the `gpu` queue, one GPU each
    broker: str = "pyamqp://guest@localhost:5672//"  # dagster-celery's default
    workers_only: bool = False  # an extra machine: Celery workers, no webserver or daemon
    dagster_yaml_source: Path | None = None  # copied into dagster_home by setup

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ServicesError(
                f"executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}"
            )
        if not 0 < self.port < 65536:
            raise ServicesError(f"port must be between 1 and 65535, got {self.port}")
        if self.workers < 0 or self.gpu_workers < 0:
            raise ServicesError("worker counts must be 0 or more")
        if self.workers_only and self.executor != "celery":
            raise ServicesError("--workers-only needs the celery executor (--executor celery)")

    @property
    def paths(self) -> ServicesPaths:
        return ServicesPaths(self.home)

    @property
    def celery(self) -> bool:
        return self.executor == "celery"


def resolve_dagster_home(
    settings: Settings, repository: Path | None, *, checkout: Path | None = None
) -> tuple[Path, Path | None]:
    """The DAGSTER_HOME for the programs this package starts, and the dagster.yaml to copy into
    it (None: leave it alone). $DAGSTER_HOME when set (the user's instance); a source `checkout`
    that has its own dagster.yaml (`dataminer dev` from an editable install); otherwise
    $DATAMINER_HOME/dagster, with a copy of the repository's dagster.yaml."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"]).expanduser().resolve(), None
    if checkout is not None and (checkout / "dagster.yaml").is_file():
        return checkout, None
    source = repository / "dagster.yaml" if repository is not None else None
    return settings.home / "dagster", source if source is not None and source.is_file() else None


def options_from_environment(
    *,
    project_dir: Path,
    host: str = "127.0.0.1",
    port: int = 3000,
    executor: str | None = None,
    workers: int = 1,
    gpu_workers: int = 1,
    broker: str | None = None,
    workers_only: bool = False,
) -> ServicesOptions:
    """Options for this process's environment: DATAMINER_HOME, DAGSTER_HOME, DATAMINER_* ..."""
    settings = load_settings()
    project_dir = project_dir.expanduser().resolve()
    if not workers_only and not (project_dir / "workspace.yaml").is_file():
        raise ServicesError(
            f"no workspace.yaml in {project_dir}: run from the project root or pass --project-dir"
        )
    dagster_home, dagster_yaml = resolve_dagster_home(settings, project_dir)
    env = {k: v for k, v in os.environ.items() if k.startswith(PASSTHROUGH_PREFIXES) and v != ""}
    env["DATAMINER_DATA_DIR"] = str(settings.data_dir)  # the same files for every program
    env["PATH"] = os.pathsep.join([str(_bin_dir()), os.environ.get("PATH", os.defpath)])
    return ServicesOptions(
        home=settings.home,
        project_dir=project_dir,
        dagster_home=dagster_home,
        bin_dir=_bin_dir(),
        env=env,
        host=host,
        port=port,
        executor=executor or executor_name(),
        workers=workers,
        gpu_workers=gpu_workers,
        broker=broker or os.environ.get("DATAMINER_CELERY_BROKER") or _default_broker(),
        workers_only=workers_only,
        dagster_yaml_source=dagster_yaml,
    )


def _default_broker() -> str:
    """dagster-celery's default (RabbitMQ on $DAGSTER_CELERY_BROKER_HOST, else localhost): what an
    unconfigured celery_executor uses, so that runs and workers meet."""
    host = os.environ.get("DAGSTER_CELERY_BROKER_HOST", "localhost")
    return f"pyamqp://guest@{host}:5672//"


def _bin_dir() -> Path:
    """The scripts directory of this Python environment (a venv's `bin/`)."""
    return Path(sys.executable).parent


# --- the configuration (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Program:
    """One `[program:x]` section. `command` and `env` values are in supervisord syntax."""

    name: str
    command: str
    startsecs: int
    stopwaitsecs: int
    numprocs: int = 1
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def process_name(self) -> str:
        if self.numprocs == 1 and "%(process_num)" not in self.command:
            return "%(program_name)s"
        return "%(program_name)s-%(process_num)02d"

    @property
    def log_name(self) -> str:
        """One log file per process (supervisord cannot expand %(process_name)s there)."""
        return self.process_name.replace("%(program_name)s", _literal(self.name)) + ".log"


def _literal(text: str) -> str:
    """Text that supervisord must not expand."""
    return text.replace("%", "%%")


def command_line(*args: str | Path) -> str:
    return " ".join(_literal(shlex.quote(str(a))) for a in args)


def _env_value(name: str, value: str) -> str:
    # supervisord splits `environment` with a non-POSIX shlex: no escapes inside quotes.
    if any(c in value for c in "\"'\n\r"):
        raise ServicesError(
            f"{name} contains a quote or a line break, which supervisord cannot pass on: {value!r}"
        )
    return f'"{_literal(value)}"'


def program_environment(options: ServicesOptions) -> dict[str, str]:
    """Plain values of the variables every program gets."""
    env = dict(options.env)
    env.update(
        DAGSTER_HOME=str(options.dagster_home),
        DATAMINER_HOME=str(options.home),
        DATAMINER_EXECUTOR=options.executor,
    )
    if options.celery:
        env["DATAMINER_CELERY_BROKER"] = options.broker
    return env


def programs(options: ServicesOptions) -> list[Program]:
    """The webserver, the daemon and, with the celery executor, the workers of each queue."""
    workspace = options.project_dir / "workspace.yaml"
    found: list[Program] = []
    if not options.workers_only:
        found.append(
            Program(
                "dagster-webserver",
                command_line(
                    options.bin_dir / "dagster-webserver",
                    "-h",
                    options.host,
                    "-p",
                    str(options.port),
                    "-w",
                    workspace,
                ),
                startsecs=10,
                stopwaitsecs=15,
            )
        )
        found.append(
            Program(
                "dagster-daemon",
                command_line(options.bin_dir / "dagster-daemon", "run", "-w", workspace),
                startsecs=10,
                stopwaitsecs=30,
            )
        )
    if options.celery:
        for queue, count in ((DEFAULT_QUEUE, options.workers), (GPU_QUEUE, options.gpu_workers)):
            if count:
                found.append(_celery_worker(options, queue, count))
    return found


def _celery_worker(options: ServicesOptions, queue: str, count: int) -> Program:
    # Node names must be unique per host and broker, also across homes: `gpu-00-1a2b3c@host`.
    home_tag = hashlib.sha1(str(options.home).encode()).hexdigest()[:6]
    node = f"{_literal(queue)}-%(process_num)02d-{home_tag}"
    command = " ".join(
        [
            command_line(
                options.bin_dir / "dagster-celery",
                "worker",
                "start",
                "-A",
                "dagster_celery.app",
                "-y",
                options.paths.celery_config,
                "-q",
                queue,
            ),
            f"-n {node}",
            # One step at a time per worker: scale with the count; a GPU holds one model.
            "-- --concurrency=1",
        ]
    )
    env = {"CUDA_VISIBLE_DEVICES": "%(process_num)d"} if queue == GPU_QUEUE else {}
    # A running step is lost when its worker is killed, so let it finish.
    return Program(
        f"celery-{queue}", command, startsecs=10, stopwaitsecs=600, numprocs=count, env=env
    )


def render_config(options: ServicesOptions, programs: list[Program]) -> str:
    """The supervisord.conf text."""
    common_env = {k: _env_value(k, v) for k, v in sorted(program_environment(options).items())}
    logs = _literal(str(options.paths.log_dir))
    lines = [
        "; Generated by `dataminer services setup`; edit the options, not this file.",
        "; It holds database URLs: keep it private (mode 0600).",
        "",
        "[unix_http_server]",
        f"file={_literal(str(options.paths.socket))}",
        "chmod=0700",
        "",
        "[supervisord]",
        f"logfile={logs}/supervisord.log",
        f"pidfile={_literal(str(options.paths.pidfile))}",
        f"childlogdir={logs}",
        f"directory={_literal(str(options.project_dir))}",
        "logfile_maxbytes=10MB",
        "logfile_backups=3",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{_literal(str(options.paths.socket))}",
    ]
    for program in programs:
        env = {**common_env, **program.env}
        lines += [
            "",
            f"[program:{program.name}]",
            f"command={program.command}",
            f"process_name={program.process_name}",
            f"numprocs={program.numprocs}",
            f"directory={_literal(str(options.project_dir))}",
            "environment=" + ",".join(f"{k}={v}" for k, v in env.items()),
            "autostart=true",
            "autorestart=true",
            f"startsecs={program.startsecs}",
            "startretries=3",
            "stopsignal=TERM",
            f"stopwaitsecs={program.stopwaitsecs}",
            # Every program starts children (code servers, run workers, `celery`): stop them too.
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={logs}/{program.log_name}",
            "stdout_logfile_maxbytes=50MB",
            "stdout_logfile_backups=5",
        ]
    return "\n".join(lines) + "\n"


def render_celery_config(options: ServicesOptions) -> str:
    """The `-y` file of `dagster-celery worker start`: the executor config block."""
    import yaml

    config = {"execution": {"config": {"broker": options.broker, "backend": "rpc://"}}}
    return yaml.safe_dump(config, sort_keys=False)


def render_dagster_yaml(source: Path) -> str:
    header = (
        f"# Copied from {source} by `dataminer services setup`: edit that file, run setup again."
    )
    return header + "\n" + source.read_text()


# --- driving supervisord --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramState:
    name: str  # process name, e.g. `celery-gpu-00`
    state: str  # RUNNING, STARTING, BACKOFF, STOPPED, EXITED, FATAL ...
    description: str  # `pid 123, uptime 0:01:02`, or why it is not running


@dataclass(frozen=True)
class SetupResult:
    config_path: Path
    programs: list[str]
    applied: str | None  # what changed in a running supervisord, None when it is not running


def setup(options: ServicesOptions) -> SetupResult:
    """Write the configuration (and the files it names); apply it if supervisord is running."""
    defined = programs(options)
    for executable in _executables(options):
        _require_executable(options.bin_dir / executable)
    options.paths.log_dir.mkdir(parents=True, exist_ok=True)
    options.dagster_home.mkdir(parents=True, exist_ok=True)
    if options.dagster_yaml_source is not None:
        _write(
            options.dagster_home / "dagster.yaml", render_dagster_yaml(options.dagster_yaml_source)
        )
    if options.celery:
        _write(options.paths.celery_config, render_celery_config(options), private=True)
    _write(options.paths.config, render_config(options, defined), private=True)
    supervisor = Supervisor(options.paths)
    applied = supervisor.apply_config() if supervisor.is_running() else None
    return SetupResult(options.paths.config, [p.name for p in defined], applied)


def _write(path: Path, text: str, *, private: bool = False) -> None:
    """Atomically; a private file is never readable by others, not even for a moment."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _executables(options: ServicesOptions) -> list[str]:
    names = ["supervisord"]
    if not options.workers_only:
        names += ["dagster-webserver", "dagster-daemon"]
    if options.celery:
        names.append("dagster-celery")
    return names


def _require_executable(path: Path) -> None:
    if not os.access(path, os.X_OK):
        hint = "pip install 'dataminer-dagster[distributed]'"
        raise ServicesError(f"{path} is missing or not executable ({hint})")


def supervisor_for_home(home: Path | None = None) -> Supervisor:
    """The supervisord of a DATAMINER_HOME (default: this environment's)."""
    return Supervisor(ServicesPaths(home or load_settings().home))


class Supervisor:
    """The supervisord of one home, over its XML-RPC Unix socket."""

    def __init__(self, paths: ServicesPaths):
        self.paths = paths

    def _rpc(self):
        from supervisor.xmlrpc import SupervisorTransport

        transport = SupervisorTransport(None, None, f"unix://{self.paths.socket}")
        return xmlrpc.client.ServerProxy("http://localhost", transport=transport).supervisor

    def is_running(self) -> bool:
        try:
            return self._rpc().getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def require_config(self) -> None:
        if not self.paths.config.is_file():
            raise ServicesError(
                f"no services configured: {self.paths.config} is missing "
                "(run `dataminer services setup` first)"
            )

    def start(self, timeout_s: float = 60.0) -> list[ProgramState]:
        """Start supervisord if needed, then every program; wait until they have settled."""
        self.require_config()
        if not self.is_running():
            self._launch(timeout_s)
        self._rpc().startAllProcesses(False)
        return self.wait_settled(timeout_s)

    def restart(self, timeout_s: float = 60.0) -> list[ProgramState]:
        """Stop every program (each gets its stop timeout), follow the configuration file if it
        changed, then start them all again; starts supervisord first if it is not running."""
        self.require_config()
        if not self.is_running():
            return self.start(timeout_s)
        rpc = self._rpc()
        rpc.stopAllProcesses(True)
        self.apply_config()
        rpc.startAllProcesses(False)
        return self.wait_settled(timeout_s)

    def _launch(self, timeout_s: float) -> None:
        supervisord = shutil.which("supervisord", path=str(_bin_dir())) or "supervisord"
        # supervisord daemonizes: the command returns once the daemon is forked.
        done = subprocess.run(
            [supervisord, "-c", str(self.paths.config)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ServicesError(
                f"supervisord -c {self.paths.config} failed: {(done.stderr or done.stdout).strip()}"
            )
        deadline = time.monotonic() + timeout_s
        while not self.is_running():
            if time.monotonic() > deadline:
                raise ServicesError(
                    f"supervisord did not answer on {self.paths.socket} within {timeout_s:.0f} s; "
                    f"see {self.paths.log_dir / 'supervisord.log'}"
                )
            time.sleep(0.1)

    def wait_settled(self, timeout_s: float) -> list[ProgramState]:
        """Program states once none is STARTING or BACKOFF (or the timeout has passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.states()
            settling = [s for s in states if s.state in ("STARTING", "BACKOFF")]
            if not settling or time.monotonic() > deadline:
                return states
            time.sleep(0.5)

    def states(self) -> list[ProgramState]:
        return [
            ProgramState(info["name"], info["statename"], info["description"])
            for info in self._rpc().getAllProcessInfo()
        ]

    def stop(self, timeout_s: float = 60.0) -> list[ProgramState]:
        """Stop every program, then supervisord itself. Returns the states after stopping."""
        rpc = self._rpc()
        rpc.stopAllProcesses(True)
        stopped = self.states()
        rpc.shutdown()
        deadline = time.monotonic() + timeout_s
        while self._pid_alive():  # supervisord removes its pidfile as it exits
            if time.monotonic() > deadline:
                raise ServicesError(f"supervisord did not exit within {timeout_s:.0f} s")
            time.sleep(0.1)
        return stopped

    def _pid_alive(self) -> bool:
        try:
            pid = int(self.paths.pidfile.read_text().strip())
        except (OSError, ValueError):
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def apply_config(self) -> str:
        """Make a running supervisord follow the rewritten file (`supervisorctl update`)."""
        rpc = self._rpc()
        added, changed, removed = rpc.reloadConfig()[0]
        for name in removed + changed:
            rpc.stopProcessGroup(name, True)
            rpc.removeProcessGroup(name)
        for name in changed + added:
            rpc.addProcessGroup(name)  # starts it: every program has autostart
        parts = [
            f"{label}: {', '.join(names)}"
            for label, names in (("added", added), ("restarted", changed), ("removed", removed))
            if names
        ]
        return "; ".join(parts) or "no program changed"
