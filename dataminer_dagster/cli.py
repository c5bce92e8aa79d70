"""The `dataminer` command."""

from __future__ import annotations

from pathlib import Path

import click

from dataminer_dagster.config import ConfigError, load_project_config


class UserError(click.ClickException):
    """An error the user can fix; printed without a traceback."""


def _context():
    """Settings, engine, lease store and catalog for this process (migrating the schema first)."""
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    engine = get_engine(claims_database_url(settings))
    migrate.upgrade(engine)
    store = LeaseStore(engine, settings.retry)
    return settings, store, Catalog(engine, store, DataPaths(settings.data_dir))


def _load_config(path: str):
    try:
        return load_project_config(Path(path))
    except ConfigError as exc:
        raise UserError(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dataminer-dagster")
def main() -> None:
    """Mine computer-vision datasets from video, as a Dagster asset graph.

    State lives in PostgreSQL: $DATAMINER_DATABASE_URL, or an embedded server under
    $DATAMINER_HOME (default ./.dataminer). Media go to $DATAMINER_DATA_DIR
    (default $DATAMINER_HOME/data).
    """


# --- database ---------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """The claim-table database."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema (safe to run again)."""
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.server import claims_database_url, mask_password
    from dataminer_dagster.settings import load_settings

    url = claims_database_url(load_settings())
    engine = get_engine(url)
    before = migrate.current_revision(engine)
    migrate.upgrade(engine)
    after = migrate.current_revision(engine)
    change = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    click.echo(f"{mask_password(url)}: schema {change} revision {after}")


@db.command("url")
def db_url() -> None:
    """Print the database URL in use (password masked)."""
    from dataminer_dagster.db.server import claims_database_url, mask_password
    from dataminer_dagster.settings import load_settings

    click.echo(mask_password(claims_database_url(load_settings())))


# --- projects ---------------------------------------------------------------------------------


@main.group()
def project() -> None:
    """Register and inspect projects."""


@project.command("add")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
def project_add(config: str) -> None:
    """Register a project from its YAML CONFIG, or update it; its video catalog is (re)queued
    when the config is new or changed. With `dagster dev` running, the sensors take it from there."""
    cfg = _load_config(config)
    _, _, catalog = _context()
    result = catalog.register_project(cfg)
    verb = "registered" if result.created else ("updated" if result.changed else "unchanged")
    click.echo(f"project {cfg.name} {verb}; output in {result.project.output_dir}")
    if result.changed:
        click.echo(
            "its video catalog is queued (the discovery sensor, `dataminer run` or `dataminer populate` runs it)"
        )


@project.command("list")
def project_list() -> None:
    """One line per project: stage, videos, output directory."""
    _, _, catalog = _context()
    projects = catalog.projects()
    if not projects:
        click.echo("no projects yet: dataminer project add CONFIG")
        return
    counts = catalog.member_counts()
    click.echo(f"{'project':<24} {'stage':<10} {'videos':>7}  output")
    for p in projects:
        click.echo(f"{p.name:<24} {p.stage:<10} {counts.get(p.id, 0):>7}  {p.output_dir}")


@main.command("add-video")
@click.argument("url")
@click.option("--project", "project_name", required=True, help="Name of an existing project.")
def add_video(url: str, project_name: str) -> None:
    """Add one video URL to an existing project."""
    from dataminer_dagster.core.video_ids import is_youtube_url, video_id_for_url, youtube_watch_url
    from dataminer_dagster.db.catalog import Candidate

    _, _, catalog = _context()
    proj = catalog.project(project_name)
    if proj is None:
        raise UserError(f"no project named {project_name!r} (dataminer project list)")
    try:
        video_id = video_id_for_url(url)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    canonical = youtube_watch_url(video_id) if is_youtube_url(url) else url
    with catalog.engine.begin() as conn:
        linked = catalog.link_videos(
            conn, proj, [Candidate(video_id, "manual", "add-video", url=canonical)]
        )
        catalog.advance_videos(conn, [video_id], reset_failed=True)
    state = "added" if linked.new_links else "already in the project (re-queued if it had failed)"
    click.echo(f"video {video_id} {state}: {project_name}")


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Only print what would be added.")
def populate(config: str, dry_run: bool) -> None:
    """Find the videos of a project's inputs (searches, URLs, files) and add them."""
    from dataminer_dagster.db.schema import DONE
    from dataminer_dagster.resources.video_sources import YtDlpSources
    from dataminer_dagster.sources import collect_candidates
    from dataminer_dagster.stages import CATALOG

    cfg = _load_config(config)
    found = collect_candidates(cfg.inputs, YtDlpSources().search)
    for problem in found.problems:
        click.echo(f"warning: {problem}", err=True)
    if dry_run:
        click.echo(f"{len(found.candidates)} videos would be added to {cfg.name}:")
        for c in found.candidates:
            click.echo(f"  {c.video_id:<24} {c.source:<9} {c.url or c.source_path}")
        return
    _, _, catalog = _context()
    result = catalog.register_project(cfg)
    with catalog.engine.begin() as conn:
        linked = catalog.link_videos(conn, result.project, found.candidates)
        queued = catalog.advance_videos(
            conn, [c.video_id for c in found.candidates], reset_failed=True
        )
        catalog.store.mark(
            CATALOG, cfg.name, DONE, "populated by the CLI", project_id=result.project.id, conn=conn
        )
    click.echo(
        f"{cfg.name}: {len(found.candidates)} videos ({linked.new_videos} new to the catalog, "
        f"{linked.new_links} newly linked, {linked.already_linked} already linked); {queued} queued"
    )


# --- running ----------------------------------------------------------------------------------


def _instance():
    """The Dagster instance of $DAGSTER_HOME, or a temporary one (runs are then not kept)."""
    import os

    import dagster as dg

    if os.environ.get("DAGSTER_HOME"):
        return dg.DagsterInstance.get(), None
    click.echo(
        "note: DAGSTER_HOME is not set, so the Dagster run history of this command is not kept",
        err=True,
    )
    import tempfile

    directory = tempfile.TemporaryDirectory(prefix="dataminer-dagster-")
    return dg.DagsterInstance.local_temp(directory.name), directory


def _run_projects(configs, *, timeout: float | None, progress: bool = True) -> int:
    from dataminer_dagster.definitions import defs
    from dataminer_dagster.driver import drive
    from dataminer_dagster.reporting import ProgressBoard

    settings, store, catalog = _context()
    projects = [catalog.register_project(cfg).project for cfg in configs]
    instance, keep_alive = _instance()
    board = (
        ProgressBoard(store.engine, projects[0].id, enabled=progress)
        if len(projects) == 1
        else None
    )
    say = board.write if board else click.echo
    try:
        result = drive(
            [p.name for p in projects],
            instance=instance,
            defs=defs,
            store=store,
            stale_after_s=settings.lease.stale_after_s,
            on_tick=board.update if board else (lambda: None),
            log=say,
            timeout_s=timeout,
        )
    finally:
        if board:
            board.close()
        if keep_alive is not None:
            instance.dispose()
            keep_alive.cleanup()
    for project in projects:
        _print_outcome(catalog.project(project.name))
    click.echo(
        f"{result.runs} runs ({result.failed_runs} with failed items) in {result.seconds:.0f} s"
    )
    return 0 if all(stage == "complete" for stage in result.stages.values()) else 1


def _print_outcome(project) -> None:
    from dataminer_dagster.paths import ProjectPaths

    dataset = ProjectPaths(project.output_dir).dataset_dir
    if project.stage != "complete":
        click.echo(
            f"project {project.name}: {project.stage}"
            + (f" ({project.error})" if project.error else "")
        )
        return
    images = len(list((dataset / "images").iterdir())) if (dataset / "images").is_dir() else 0
    click.echo(f"project {project.name}: complete; dataset of {images} images in {dataset}")
    for name in ("manifest.parquet", "annotations.coco.json"):
        if (dataset / name).is_file():
            click.echo(f"  {dataset / name}")


@main.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@click.option("--no-progress", is_flag=True, help="No progress bars (for logs).")
def run_command(config: str, timeout: float | None, no_progress: bool) -> None:
    """Drive a project to complete in this process: the sensors' decisions, the same runs,
    with progress bars. For machines without the Dagster UI."""
    raise SystemExit(
        _run_projects([_load_config(config)], timeout=timeout, progress=not no_progress)
    )


@main.command()
@click.option("--videos", type=int, default=6, show_default=True, help="Sample videos to make.")
@click.option(
    "--port", type=int, default=47291, show_default=True, help="Local port that serves them."
)
@click.option("--no-progress", is_flag=True, help="No progress bars (for logs).")
def demo(videos: int, port: int, no_progress: bool) -> None:
    """A real pipeline run with no network: sample videos served on 127.0.0.1, downloaded with
    yt-dlp, filtered, deduplicated, detected and exported. Uses real model weights when they are
    on this machine, tiny random-weight models otherwise (and says so)."""
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.demo import (
        choose_models,
        demo_config,
        serve_directory,
        write_demo_config,
        write_sample_videos,
    )
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    root = settings.home / "demo"
    click.echo(f"demo: writing {videos} sample videos to {root / 'www'}")
    clips = write_sample_videos(root / "www", videos)
    models = choose_models(root / "models", click.echo)
    with serve_directory(root / "www", port=port) as base:
        raw = demo_config(
            "demo",
            [f"{base}/{clip.name}" for clip in clips],
            models,
            settings.data_dir / "projects" / "demo",
        )
        path = write_demo_config(root / "demo.yaml", raw)
        click.echo(f"demo: project config in {path}; serving the videos at {base}")
        code = _run_projects(
            [parse_project_config(raw, source=str(path))], timeout=None, progress=not no_progress
        )
    raise SystemExit(code)


# --- services (supervisord) -------------------------------------------------------------------


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
    type=click.Choice(["multiprocess", "celery"]),
    default=None,
    help="Run steps in processes on this machine, or on Celery workers "
    "[default: $DATAMINER_EXECUTOR, else multiprocess].",
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
    dagster.yaml), DATAMINER_HOME, the DATAMINER_* variables of this shell (database URLs
    included) and the project directory as its working directory.
    """
    from dataminer_dagster import services as svc

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
    from dataminer_dagster import services as svc
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    supervisor = svc.supervisor_for_home()
    try:
        supervisor.require_config()
        # The sensors expect the claim tables; this also creates the embedded database once,
        # before several programs race to do it.
        migrate.upgrade(get_engine(claims_database_url(load_settings())))
        states = supervisor.start(timeout_s=timeout)
    except svc.ServicesError as exc:
        raise UserError(str(exc)) from None
    _print_program_states(states)
    if any(s.state != "RUNNING" for s in states):
        raise UserError(f"not every program is running; logs in {supervisor.paths.log_dir}")


@services.command("stop")
def services_stop():
    """Stop every program (running steps get their stop timeout), then supervisord."""
    from dataminer_dagster import services as svc

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
    from dataminer_dagster import services as svc

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
