"""`dataminer services`: dagster-webserver, dagster-daemon and Celery workers under a private supervisord."""

from __future__ import annotations

from pathlib import Path

import click

from dataminer_dagster.cli.app import UserError, main


@main.group()
def services() -> None:
    """Run dagster-webserver, dagster-daemon and Celery workers under supervisord.

    One supervisord per $DATAMINER_HOME: its configuration, socket, pidfile and logs live in
    $DATAMINER_HOME/services/. No root, no /etc. Run `setup` once (again after changing options),
    then `start`, `status` and `stop`.
    """


@services.command("setup")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address dagster-webserver binds to; 0.0.0.0 exposes the UI to the network.",
)
@click.option("--port", default=3000, show_default=True, type=int, help="dagster-webserver port.")
@click.option(
    "--executor",
    type=click.Choice(["in_process", "multiprocess", "celery"]),
    default=None,
    help="Run each run's steps in its process, in a process each, or on Celery workers "
    "[default: $DATAMINER_EXECUTOR, else in_process].",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Celery workers on the default `dagster` queue (celery executor only).",
)
@click.option(
    "--gpu-workers",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Celery workers on the `gpu` queue, one per GPU: worker N sees GPU N.",
)
@click.option(
    "--broker",
    default=None,
    help="Celery broker URL [default: $DATAMINER_CELERY_BROKER, else "
    "pyamqp://guest@localhost:5672//].",
)
@click.option(
    "--workers-only",
    is_flag=True,
    help="Only the Celery workers: for extra (e.g. GPU) machines of a deployment.",
)
@click.option(
    "--project-dir",
    type=click.Path(file_okay=False, exists=True),
    default=".",
    show_default=True,
    help="Project root (with workspace.yaml): every program's working directory.",
)
def services_setup(host, port, executor, workers, gpu_workers, broker, workers_only, project_dir):
    """Write $DATAMINER_HOME/services/supervisord.conf (applied at once if supervisord runs).

    Every program gets DAGSTER_HOME (default $DATAMINER_HOME/dagster, with a copy of the project's
    dagster.yaml), DATAMINER_HOME, the DATAMINER_*, DAGSTER_* and HF_* variables of this shell
    (database URLs included) and the project directory as its working directory.
    """
    from dataminer_dagster.hosting import supervisord as svc

    try:
        options = svc.options_from_environment(
            project_dir=Path(project_dir),
            host=host,
            port=port,
            executor=executor,
            workers=workers,
            gpu_workers=gpu_workers,
            broker=broker,
            workers_only=workers_only,
        )
        result = svc.setup(options)
    except svc.ServicesError as exc:
        raise UserError(str(exc)) from None
    click.echo(f"wrote {result.config_path}")
    click.echo(f"programs: {', '.join(result.programs)}; logs in {options.paths.log_dir}")
    if not options.workers_only:
        click.echo(f"dagster-webserver will listen on http://{options.host}:{options.port}")
    if result.applied is not None:
        click.echo(f"supervisord is running: {result.applied}")
    else:
        click.echo("start them with: dataminer services start")


def _print_program_states(states) -> None:
    for s in states:
        click.echo(f"{s.name:<24} {s.state:<10} {s.description}")


@services.command("start")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=float,
    help="Seconds to wait for the programs to be up.",
)
def services_start(timeout):
    """Migrate the database schema, start supervisord if needed, then every program; print
    their states.

    Exits with status 1 when a program is not RUNNING afterwards (see its log).
    """
    _run_services(lambda supervisor: supervisor.start(timeout_s=timeout))


@services.command("restart")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=float,
    help="Seconds to wait for the programs to be up again.",
)
def services_restart(timeout):
    """Stop every program, follow a changed configuration (`services setup`), and start them
    again (supervisord too, if it is not running); print their states. Runs in flight are
    stopped with the daemon; their work goes back to the queue and is requested again.

    Exits with status 1 when a program is not RUNNING afterwards (see its log).
    """
    _run_services(lambda supervisor: supervisor.restart(timeout_s=timeout))


def _run_services(action) -> None:
    import sqlalchemy as sa

    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.hosting import supervisord as svc
    from dataminer_dagster.settings import load_settings

    supervisor = svc.supervisor_for_home()
    try:
        supervisor.require_config()
        # The sensors expect the claim tables; this also creates the embedded database once,
        # before several programs race to do it.
        settings = load_settings()
        url = claims_database_url(settings)
        try:
            migrate.ensure_schema(get_engine(url, lease=settings.lease))
        except sa.exc.OperationalError as exc:
            raise UserError(f"cannot migrate {redact_url(url)}: {exc.orig}") from None
        states = action(supervisor)
    except svc.ServicesError as exc:
        raise UserError(str(exc)) from None
    _print_program_states(states)
    if any(s.state != "RUNNING" for s in states):
        raise UserError(f"not every program is running; logs in {supervisor.paths.log_dir}")


@services.command("stop")
def services_stop():
    """Stop every program (running steps get their stop timeout), then supervisord."""
    from dataminer_dagster.hosting import supervisord as svc

    supervisor = svc.supervisor_for_home()
    if not supervisor.is_running():
        click.echo(f"supervisord is not running for {supervisor.paths.home}")
        return
    try:
        states = supervisor.stop()
    except svc.ServicesError as exc:
        raise UserError(str(exc)) from None
    _print_program_states(states)
    click.echo("supervisord stopped")


@services.command("status")
def services_status():
    """Print each program's state. Exits with status 3 unless every program is RUNNING
    (like supervisorctl), also when supervisord is not running."""
    from dataminer_dagster.hosting import supervisord as svc

    supervisor = svc.supervisor_for_home()
    if not supervisor.paths.config.is_file():
        click.echo(f"no services configured for {supervisor.paths.home} (dataminer services setup)")
        raise SystemExit(3)
    if not supervisor.is_running():
        click.echo(
            f"supervisord is not running for {supervisor.paths.home} (dataminer services start)"
        )
        raise SystemExit(3)
    states = supervisor.states()
    _print_program_states(states)
    if any(s.state != "RUNNING" for s in states):
        raise SystemExit(3)
