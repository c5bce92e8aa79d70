"""`dataminer services`: the supervisord configuration (pure), and real supervisord round trips."""

from __future__ import annotations

import configparser
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from dataminer_dagster.cli import main
from dataminer_dagster.hosting import supervisord as svc
from tests.helpers.ports import unused_port

BIN_DIR = Path(sys.executable).parent
REPO_ROOT = Path(__file__).resolve().parents[1]
# A database URL with a percent-encoded password: supervisord must pass the `%` on unchanged.
DB_URL = "postgresql://miner:p%40ss@db.example:5432/dataminer"


def _options(tmp_path: Path, **overrides) -> svc.ServicesOptions:
    values = dict(
        home=tmp_path / "home",
        project_dir=REPO_ROOT,
        dagster_home=tmp_path / "home" / "dagster",
        bin_dir=BIN_DIR,
        env={"DATAMINER_DATABASE_URL": DB_URL, "PATH": f"{BIN_DIR}:/usr/bin:/bin"},
    )
    values.update(overrides)
    return svc.ServicesOptions(**values)


def _parse(text: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser()  # supervisord's own `%(name)s` stays unexpanded
    parser.read_string(text)
    return parser


def _supervisord_view(options: svc.ServicesOptions) -> dict:
    """process name -> its config as supervisord itself reads the written file."""
    from supervisor.options import ServerOptions

    options.paths.log_dir.mkdir(parents=True, exist_ok=True)
    options.paths.config.write_text(svc.render_config(options, svc.programs(options)))
    server = ServerOptions()
    server.configfile = str(options.paths.config)
    server.process_config(do_usage=False)
    return {pc.name: pc for group in server.process_group_configs for pc in group.process_configs}


# --- the configuration ------------------------------------------------------------------------


def test_default_config_runs_webserver_and_daemon_on_localhost(tmp_path):
    options = _options(tmp_path)
    config = _parse(svc.render_config(options, svc.programs(options)))

    assert config.get("unix_http_server", "file") == str(options.paths.socket)
    assert config.get("supervisord", "pidfile") == str(options.paths.pidfile)
    assert config.get("supervisorctl", "serverurl") == f"unix://{options.paths.socket}"
    assert [s for s in config.sections() if s.startswith("program:")] == [
        "program:dagster-webserver",
        "program:dagster-daemon",
    ]
    webserver = config.get("program:dagster-webserver", "command").split()
    assert webserver[0] == str(BIN_DIR / "dagster-webserver")
    assert webserver[webserver.index("-h") + 1] == "127.0.0.1"
    assert webserver[webserver.index("-p") + 1] == "3000"
    assert webserver[webserver.index("-w") + 1] == str(REPO_ROOT / "workspace.yaml")
    assert config.get("program:dagster-daemon", "command").split()[1:] == [
        "run",
        "-w",
        str(REPO_ROOT / "workspace.yaml"),
    ]
    for program in ("dagster-webserver", "dagster-daemon"):
        section = f"program:{program}"
        assert config.get(section, "directory") == str(REPO_ROOT)
        assert config.get(section, "autorestart") == "true"
        assert config.get(section, "stopasgroup") == "true"
        assert int(config.get(section, "startsecs")) > 0
        assert int(config.get(section, "stopwaitsecs")) > 0
        assert config.get(section, "stdout_logfile") == str(
            options.paths.log_dir / f"{program}.log"
        )


def test_supervisord_reads_every_programs_environment_as_meant(tmp_path):
    options = _options(tmp_path, executor="celery", workers=2, gpu_workers=1)
    processes = _supervisord_view(options)

    assert sorted(processes) == [
        "celery-dagster-00",
        "celery-dagster-01",
        "celery-gpu-00",
        "dagster-daemon",
        "dagster-webserver",
    ]
    for process in processes.values():
        env = process.environment
        assert env["DAGSTER_HOME"] == str(options.dagster_home)
        assert env["DATAMINER_HOME"] == str(options.home)
        assert env["DATAMINER_DATABASE_URL"] == DB_URL  # `%` survived supervisord's expansion
        assert env["DATAMINER_EXECUTOR"] == "celery"
        assert env["DATAMINER_CELERY_BROKER"] == options.broker
        assert process.directory == str(REPO_ROOT)
        assert process.autorestart is not False
    assert processes["celery-gpu-00"].environment["CUDA_VISIBLE_DEVICES"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in processes["celery-dagster-01"].environment


def test_celery_workers_listen_on_their_queue_with_unique_names(tmp_path):
    options = _options(tmp_path, executor="celery", workers=2, gpu_workers=2)
    processes = _supervisord_view(options)

    def arg(process: str, flag: str) -> str:
        command = processes[process].command.split()
        return command[command.index(flag) + 1]

    assert {arg(p, "-q") for p in processes if p.startswith("celery-dagster")} == {"dagster"}
    assert {arg(p, "-q") for p in processes if p.startswith("celery-gpu")} == {"gpu"}
    names = [arg(p, "-n") for p in processes if p.startswith("celery-")]
    assert len(set(names)) == 4
    for process in (p for p in processes if p.startswith("celery-")):
        command = processes[process].command.split()
        assert command[:5] == [
            str(BIN_DIR / "dagster-celery"),
            "worker",
            "start",
            "-A",
            "dagster_celery.app",
        ]
        assert arg(process, "-y") == str(options.paths.celery_config)
        assert command[-2:] == ["--", "--concurrency=1"]


@pytest.mark.parametrize("executor", ["in_process", "multiprocess"])
def test_local_executors_start_no_workers_and_workers_only_no_webserver(tmp_path, executor):
    assert [p.name for p in svc.programs(_options(tmp_path, executor=executor, workers=3))] == [
        "dagster-webserver",
        "dagster-daemon",
    ]
    workers_only = _options(tmp_path, executor="celery", workers=0, workers_only=True)
    assert [p.name for p in svc.programs(workers_only)] == ["celery-gpu"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"executor": "ray"}, "executor must be one of in_process, multiprocess, celery"),
        ({"port": 0}, "port must be between 1 and 65535"),
        ({"workers_only": True}, "--workers-only needs the celery executor"),
    ],
)
def test_bad_options_are_refused_with_the_reason(tmp_path, overrides, message):
    with pytest.raises(svc.ServicesError, match=message):
        _options(tmp_path, **overrides)


def test_a_value_supervisord_cannot_quote_is_refused(tmp_path):
    options = _options(tmp_path, env={"DATAMINER_DATABASE_URL": 'postgresql://a"b@h/db'})
    with pytest.raises(svc.ServicesError, match="DATAMINER_DATABASE_URL contains a quote"):
        svc.render_config(options, svc.programs(options))


def test_setup_cli_writes_one_private_config_per_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.setenv("DATAMINER_DATABASE_URL", DB_URL)
    runner = CliRunner()
    homes = [tmp_path / "a", tmp_path / "b"]
    for home, host in zip(homes, ["0.0.0.0", "127.0.0.1"], strict=True):
        monkeypatch.setenv("DATAMINER_HOME", str(home))
        result = runner.invoke(
            main,
            [
                "services",
                "setup",
                "--host",
                host,
                "--port",
                "3123",
                "--project-dir",
                str(REPO_ROOT),
            ],
        )
        assert result.exit_code == 0, result.output
        assert "start them with: dataminer services start" in result.output

    for home, host in zip(homes, ["0.0.0.0", "127.0.0.1"], strict=True):
        conf = home / "services" / "supervisord.conf"
        assert conf.stat().st_mode & 0o077 == 0  # it holds the database URL
        command = _parse(conf.read_text()).get("program:dagster-webserver", "command").split()
        assert command[command.index("-h") + 1] == host
        copied = (home / "dagster" / "dagster.yaml").read_text()
        assert (REPO_ROOT / "dagster.yaml").read_text() in copied


def test_setup_cli_explains_a_missing_workspace(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAMINER_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(main, ["services", "setup", "--project-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert f"no workspace.yaml in {tmp_path}" in result.output


def test_status_without_supervisord_says_so(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DATAMINER_HOME", str(home))
    runner = CliRunner()

    result = runner.invoke(main, ["services", "status"])
    assert result.exit_code == 3
    assert "no services configured" in result.output

    options = _options(tmp_path, home=home)
    options.paths.services_dir.mkdir(parents=True)
    options.paths.config.write_text(svc.render_config(options, svc.programs(options)))
    result = runner.invoke(main, ["services", "status"])
    assert result.exit_code == 3
    assert f"supervisord is not running for {home}" in result.output

    result = runner.invoke(main, ["services", "stop"])
    assert result.exit_code == 0
    assert "supervisord is not running" in result.output


# --- real supervisord ---------------------------------------------------------------------------


@pytest.fixture
def supervisor_cleanup():
    """Shut down every supervisord a test registers, whatever happened."""
    started: list[svc.Supervisor] = []
    yield started.append
    for supervisor in started:
        if supervisor.is_running():
            supervisor.stop()


STAND_IN = (
    "import json, os, sys, time; "
    "json.dump({'env': dict(os.environ), 'cwd': os.getcwd()}, open(sys.argv[1], 'w')); "
    "time.sleep(600)"
)


def test_start_status_stop_round_trip(dataminer_env, tmp_path, monkeypatch, supervisor_cleanup):
    """A harmless stand-in program under the real supervisord, driven through the CLI."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    options = svc.options_from_environment(project_dir=REPO_ROOT)
    seen = tmp_path / "seen.json"
    stand_in = svc.Program(
        "stand-in",
        svc.command_line(sys.executable, "-c", STAND_IN, seen),
        startsecs=1,
        stopwaitsecs=5,
    )
    options.paths.log_dir.mkdir(parents=True)
    options.paths.config.write_text(svc.render_config(options, [stand_in]))
    supervisor_cleanup(svc.supervisor_for_home(options.home))
    runner = CliRunner()

    started = runner.invoke(main, ["services", "start", "--timeout", "30"])
    assert started.exit_code == 0, started.output
    assert "stand-in" in started.output and "RUNNING" in started.output

    status = runner.invoke(main, ["services", "status"])
    assert status.exit_code == 0, status.output
    assert status.output.split()[:2] == ["stand-in", "RUNNING"]
    program = json.loads(seen.read_text())
    assert program["cwd"] == str(REPO_ROOT)
    assert program["env"]["DATAMINER_HOME"] == str(dataminer_env)
    assert program["env"]["DATAMINER_DATABASE_URL"] == os.environ["DATAMINER_DATABASE_URL"]
    assert program["env"]["DAGSTER_HOME"] == str(dataminer_env / "dagster")

    # `setup` while supervisord runs applies the new file, like `supervisorctl update`.
    second = svc.Program("second", svc.command_line(sys.executable, "-c", STAND_IN, seen), 1, 5)
    options.paths.config.write_text(svc.render_config(options, [stand_in, second]))
    supervisor = svc.supervisor_for_home(options.home)
    assert supervisor.apply_config() == "added: second"
    assert {s.name: s.state for s in supervisor.wait_settled(30)} == {
        "stand-in": "RUNNING",
        "second": "RUNNING",
    }

    stopped = runner.invoke(main, ["services", "stop"])
    assert stopped.exit_code == 0, stopped.output
    assert "supervisord stopped" in stopped.output
    assert stopped.output.count("STOPPED") == 2
    assert not options.paths.pidfile.exists()
    status = runner.invoke(main, ["services", "status"])
    assert status.exit_code == 3
    assert "supervisord is not running" in status.output


def _server_info(port: int, timeout_s: float) -> dict:
    """RUNNING means up for `startsecs`; the webserver may still be loading the code location."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as r:
                return json.load(r)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "(gone)"


def _processes_with_env(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_webserver_and_daemon_serve_then_stop_with_their_children(
    dataminer_env, monkeypatch, supervisor_cleanup
):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    port = unused_port()
    runner = CliRunner()
    setup = runner.invoke(
        main, ["services", "setup", "--port", str(port), "--project-dir", str(REPO_ROOT)]
    )
    assert setup.exit_code == 0, setup.output
    supervisor = svc.supervisor_for_home(dataminer_env)
    supervisor_cleanup(supervisor)

    started = runner.invoke(main, ["services", "start", "--timeout", "120"])
    logs = "\n".join(p.read_text()[-2000:] for p in supervisor.paths.log_dir.glob("*.log"))
    assert started.exit_code == 0, started.output + logs
    assert {s.name: s.state for s in supervisor.states()} == {
        "dagster-webserver": "RUNNING",
        "dagster-daemon": "RUNNING",
    }
    assert _server_info(port, timeout_s=90)["dagster_webserver_version"]
    marker = f"DAGSTER_HOME={dataminer_env / 'dagster'}\0"
    assert len(_processes_with_env(marker)) > 2  # the programs and their code servers

    stopped = runner.invoke(main, ["services", "stop"])
    assert stopped.exit_code == 0, stopped.output
    # stopasgroup: the code servers got the signal too; they exit a moment after their parents.
    deadline = time.monotonic() + 30
    while (left := _processes_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], [(pid, _cmdline(pid)) for pid in left]


def test_a_long_home_puts_the_socket_in_the_temporary_directory(tmp_path):
    from dataminer_dagster.hosting.supervisord import MAX_SOCKET_PATH, ServicesPaths

    short = ServicesPaths(Path("/srv/dm"))
    assert short.socket.parent == short.services_dir
    long_home = tmp_path / ("very-long-directory-name-" * 5) / "home"
    paths = ServicesPaths(long_home)
    assert len(str(paths.socket)) <= MAX_SOCKET_PATH
    assert paths.socket == ServicesPaths(long_home).socket, "the same for every command"
    assert paths.socket != ServicesPaths(tmp_path / "other").socket


def test_a_long_home_keeps_the_socket_in_a_folder_only_its_user_may_enter(tmp_path, monkeypatch):
    import tempfile

    from dataminer_dagster.hosting.supervisord import ServicesPaths

    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    socket_path = ServicesPaths(tmp_path / ("very-long-directory-name-" * 5) / "home").socket
    assert socket_path.parent != shared, "not a predictable name in the shared directory"
    folder = socket_path.parent
    while folder != shared:
        assert folder.stat().st_uid == os.getuid()
        assert folder.stat().st_mode & 0o777 == 0o700, folder
        folder = folder.parent


def test_a_private_socket_folder_that_another_user_made_is_refused(tmp_path, monkeypatch):
    import tempfile

    from dataminer_dagster.hosting.supervisord import ServicesPaths

    shared = tmp_path / "tmp"
    shared.mkdir(mode=0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    planted = shared / f"dataminer-{os.getuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # made first by someone else, open to all
    with pytest.raises(svc.ServicesError, match=str(planted)):
        _ = ServicesPaths(tmp_path / ("very-long-directory-name-" * 5) / "home").socket
