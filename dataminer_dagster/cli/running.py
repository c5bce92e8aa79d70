"""`dataminer run` and `dataminer demo`: driving projects to complete in this process."""

from __future__ import annotations

import click

from dataminer_dagster.cli.app import context, load_config, main


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

    from dataminer_dagster.hosting.driver import IN_MEMORY_EVENT_LOG

    directory = tempfile.TemporaryDirectory(prefix="dataminer-dagster-")
    # A throw-away instance has no id worth keeping: with telemetry on, Dagster would make one and
    # print its telemetry notice on a machine that never ran Dagster.
    instance = dg.DagsterInstance.local_temp(
        directory.name, overrides={"telemetry": {"enabled": False}, **IN_MEMORY_EVENT_LOG}
    )
    return instance, directory


# What keeps the libraries' own lines off the terminal: transformers' advisory warnings and
# weight-loading bars, Ultralytics' settings file notes. A value set in the environment wins.
QUIET_LIBRARIES = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "YOLO_VERBOSE": "False",
}


def quiet_libraries() -> None:
    """Set QUIET_LIBRARIES in this process's environment; the libraries read them when imported,
    which the commands do lazily, after this."""
    import os

    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)


verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Also show the libraries' own lines (transformers, Ultralytics).",
)


def run_projects(configs, *, timeout: float | None, progress: bool = True) -> int:
    """Drive `configs`' projects to complete; the exit code. The command waits out a database
    outage (db/outages.py) from its first connection to its last line, as its runs do: a command
    started while the database restarts waits for it instead of ending."""
    from dataminer_dagster.db.outages import DatabaseUnreachable, waiting_for_the_database
    from dataminer_dagster.settings import load_settings

    with waiting_for_the_database(load_settings().lease):
        try:
            return _run_projects(configs, timeout=timeout, progress=progress)
        except DatabaseUnreachable as exc:  # waited for it as long as the settings say
            click.echo(f"stopped: {exc}; run the command again to go on from there", err=True)
            return 1


def _run_projects(configs, *, timeout: float | None, progress: bool) -> int:
    from dataminer_dagster.cli.board import ProgressBoard
    from dataminer_dagster.cli.registration import registration_lines
    from dataminer_dagster.definitions import LANES, defs
    from dataminer_dagster.engine.planning import RunLimits
    from dataminer_dagster.hosting.driver import ProjectsGone, drive

    settings, store, catalog, registered, waiting = _registered(configs)
    for result in registered:
        if result.changed and not result.created:
            for line in registration_lines(result)[1:]:
                click.echo(f"{result.project.name}: {line}")
    projects = [result.project for result in registered]
    instance, keep_alive = _instance()
    board = (
        ProgressBoard(store.engine, projects[0].id, enabled=progress)
        if len(projects) == 1
        else None
    )
    say = board.write if board else click.echo
    stopped: Exception | None = None
    try:
        try:
            result = drive(
                [p.name for p in projects],
                instance=instance,
                defs=defs,
                store=store,
                limits=RunLimits(settings.lease, settings.runs),
                on_tick=board.update if board else (lambda: None),
                log=say,
                timeout_s=timeout,
                lanes=LANES,
            )
        except (TimeoutError, ProjectsGone) as exc:  # how a run ends, not a fault in it
            stopped = exc
        if board:
            waiting(lambda: board.update(force=True))  # the last counts
    finally:
        if board:
            board.close()
        if keep_alive is not None:
            instance.dispose()
            keep_alive.cleanup()
    rows = waiting(lambda: [catalog.projects.get(project.name) for project in projects])
    for row in rows:
        if row is not None:
            _print_outcome(row)
    if isinstance(stopped, TimeoutError):
        click.echo(f"stopped: {stopped}; run the command again to go on from there", err=True)
        return 1
    if stopped is not None:
        click.echo(f"stopped: {stopped}", err=True)
        return 1
    click.echo(
        f"{result.runs} runs ({result.failed_runs} with failed items) in {result.seconds:.0f} s"
    )
    from dataminer_dagster.db.project_flow import COMPLETE

    return 0 if all(stage == COMPLETE for stage in result.stages.values()) else 1


def _registered(configs):
    """Settings, lease store, catalog, the projects registered, and a `waiting(call)` that tries a
    call again while the database is away: the schema migrated and the projects registered are
    safe to repeat (a registration that went through registers nothing new)."""
    import functools

    import sqlalchemy as sa

    from dataminer_dagster.db.outages import outages_of, wait_out
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    outages = outages_of(sa.make_url(claims_database_url(load_settings())))
    waiting = functools.partial(wait_out, outages=outages)

    def register():
        settings, store, catalog = context()
        protected = settings.protected_dirs
        registered = [catalog.projects.register(cfg, protected=protected) for cfg in configs]
        return settings, store, catalog, registered

    return (*waiting(register), waiting)


def _print_outcome(project) -> None:
    from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, IMAGES_DIR, MANIFEST_FILE
    from dataminer_dagster.assets.dataset.dataset_formats import (
        REPORT_FILE,
        YOLO_DATA_YAML,
        YOLO_DIR,
    )
    from dataminer_dagster.db.project_flow import COMPLETE
    from dataminer_dagster.paths import ProjectPaths

    dataset = ProjectPaths(project.output_dir).dataset_dir
    if project.stage != COMPLETE:
        click.echo(
            f"project {project.name}: {project.stage}"
            + (f" ({project.error})" if project.error else "")
        )
        return
    images_dir = dataset / IMAGES_DIR
    images = len(list(images_dir.iterdir())) if images_dir.is_dir() else 0
    click.echo(f"project {project.name}: complete; dataset of {images} images in {dataset}")
    if images and (line := _contents_line(dataset)):
        click.echo(f"  {line}")
    for name in (MANIFEST_FILE, COCO_FILE, f"{YOLO_DIR}/{YOLO_DATA_YAML}", REPORT_FILE):
        if (dataset / name).is_file():
            click.echo(f"  {dataset / name}")


def _contents_line(dataset) -> str | None:
    """What the dataset in `dataset` holds: "train 10, val 1, test 1 images; 26 boxes (circle 5,
    square 9, ...)"; None for a dataset made before splits."""
    from collections import Counter

    from dataminer_dagster.assets.dataset.dataset_formats import DatasetFormatError, read_contents
    from dataminer_dagster.assets.dataset.dataset_splits import SPLITS

    try:
        contents = read_contents(dataset)
    except DatasetFormatError:
        return None
    per_split = Counter(image.split for image in contents.images)
    line = ", ".join(f"{split} {per_split[split]}" for split in SPLITS) + " images"
    if contents.names is None:
        return line
    per_class = Counter(box.category for image in contents.images for box in image.boxes)
    classes = ", ".join(f"{name} {per_class[i]}" for i, name in enumerate(contents.names))
    return f"{line}; {sum(per_class.values())} boxes ({classes})"


@main.command("run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds.")
@click.option("--no-progress", is_flag=True, help="No progress bars (for logs).")
@verbose_option
def run_command(config: str, timeout: float | None, no_progress: bool, verbose: bool) -> None:
    """Drive a project to complete in this process: the sensors' decisions, the same runs,
    with progress bars. For machines without the Dagster UI."""
    if not verbose:
        quiet_libraries()
    raise SystemExit(run_projects([load_config(config)], timeout=timeout, progress=not no_progress))


@main.command()
@click.option(
    "--port", type=int, default=47291, show_default=True, help="Local port that serves the videos."
)
@click.option("--no-progress", is_flag=True, help="No progress bars (for logs).")
@verbose_option
def demo(port: int, no_progress: bool, verbose: bool) -> None:
    """A real pipeline run with no network: the twelve clips of a synthetic world served on
    127.0.0.1, downloaded with yt-dlp, filtered, deduplicated, detected and exported, by the tiny
    models trained on that world (shipped with the package)."""
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.demo import (
        PROMPTED_COLOURS,
        demo_config,
        serve_directory,
        write_demo_config,
        write_demo_world,
    )
    from dataminer_dagster.settings import load_settings

    if not verbose:
        quiet_libraries()
    settings = load_settings()
    root = settings.home / "demo"
    click.echo(f"demo: writing a synthetic world of shapes to {root / 'www'}")
    world = write_demo_world(root / "www")
    with serve_directory(root / "www", port=port) as base:
        raw = demo_config("demo", world.urls(base), settings.data_dir / "projects" / "demo")
        path = write_demo_config(root / "demo.yaml", raw)
        click.echo(
            f"demo: {len(raw['inputs']['urls'])} videos at {base}; the project ({path}) keeps the "
            f"{' and '.join(PROMPTED_COLOURS)} shapes, drops black, blurred and text screens, and "
            "detects circles, squares, triangles and stars with the tiny SigLIP and YOLO trained "
            "on this world"
        )
        code = run_projects(
            [parse_project_config(raw, source=str(path))], timeout=None, progress=not no_progress
        )
    raise SystemExit(code)
