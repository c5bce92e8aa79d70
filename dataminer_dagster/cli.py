"""The `dataminer` command."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from dataminer_dagster.config import ConfigError, load_project_config
from dataminer_dagster.db.schema import BLOCKED, DEAD, FAILED, STATUSES
from dataminer_dagster.paths import UnsafePathError
from dataminer_dagster.settings import SettingsError
from dataminer_dagster.stages import ALL_STAGES, DOWNLOAD, FILTER, FRAMES


class UserError(click.ClickException):
    """An error the user can fix; printed without a traceback."""


class _Commands(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (SettingsError, UnsafePathError) as exc:  # settings read, or a project registered
            raise UserError(str(exc)) from None


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
    migrate.ensure_schema(engine)
    store = LeaseStore(engine, settings.retry)
    return settings, store, Catalog(engine, store, DataPaths(settings.data_dir))


def _load_config(path: str):
    try:
        return load_project_config(Path(path))
    except ConfigError as exc:
        raise UserError(str(exc)) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
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
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    url = claims_database_url(load_settings())
    engine = get_engine(url)
    before = migrate.current_revision(engine)
    migrate.upgrade(engine)
    after = migrate.current_revision(engine)
    change = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    click.echo(f"{redact_url(url)}: schema {change} revision {after}")


@db.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL server (it runs in the background once started; the next
    command starts it again). Does nothing with $DATAMINER_DATABASE_URL."""
    from dataminer_dagster.db.server import stop_embedded
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    if settings.database_url:
        click.echo("DATAMINER_DATABASE_URL is set: there is no embedded server to stop")
        return
    stopped = stop_embedded(settings)
    click.echo(
        f"embedded PostgreSQL at {settings.embedded_pgdata} "
        + ("stopped" if stopped else "was not running")
    )


@db.command("url")
def db_url() -> None:
    """Print the database URL in use (password and secret query values masked)."""
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    click.echo(redact_url(claims_database_url(load_settings())))


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
    settings, _, catalog = _context()
    result = catalog.register_project(cfg, protected=settings.protected_dirs)
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
    from dataminer_dagster.acquisition.video_ids import (
        is_youtube_url,
        video_id_for_url,
        youtube_watch_url,
    )
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
    from dataminer_dagster.acquisition.inputs import collect_candidates
    from dataminer_dagster.core.redact import redact
    from dataminer_dagster.db.schema import DONE
    from dataminer_dagster.resources.download_client import YtDlpClient
    from dataminer_dagster.stages import CATALOG

    cfg = _load_config(config)
    found = collect_candidates(cfg.inputs, YtDlpClient().search)
    for problem in found.problems:
        click.echo(f"warning: {problem}", err=True)
    if dry_run:
        click.echo(f"{len(found.candidates)} videos would be added to {cfg.name}:")
        for c in found.candidates:
            click.echo(f"  {c.video_id:<24} {c.source:<9} {redact(c.url or c.source_path)}")
        return
    settings, _, catalog = _context()
    result = catalog.register_project(cfg, protected=settings.protected_dirs)
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
    from dataminer_dagster.definitions import LANES, defs
    from dataminer_dagster.driver import drive
    from dataminer_dagster.reporting import ProgressBoard

    settings, store, catalog = _context()
    projects = [
        catalog.register_project(cfg, protected=settings.protected_dirs).project for cfg in configs
    ]
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
            lanes=LANES,
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


# --- status -----------------------------------------------------------------------------------


def _project_or_fail(catalog, name: str):
    project = catalog.project(name)
    if project is None:
        raise UserError(f"no project named {name!r} (dataminer project list)")
    return project


def _project_status(catalog, project, window: float) -> dict:
    from dataminer_dagster.db.status import frame_counts, recent_failures
    from dataminer_dagster.db.throughput import stage_progress
    from dataminer_dagster.reporting import BOARD_STAGES
    from dataminer_dagster.settings import load_settings

    engine = catalog.engine
    stages = [
        {
            "stage": p.stage,
            **p.counts,
            "finished_in_window": p.finished_in_window,
            "per_minute": round(p.per_minute, 3),
            "eta_s": None if p.eta_s is None else round(p.eta_s, 1),
        }
        for p in stage_progress(engine, project.id, BOARD_STAGES, window)
    ]
    failures = [
        {
            "stage": f.stage,
            "item": f.item_key,
            "status": f.status,
            "attempts": f.attempts,
            "error": f.last_error,
            "at": f.updated_at.isoformat(timespec="seconds"),
        }
        for f in recent_failures(engine, project.id)
    ]
    long_running = [
        {
            "stage": held.stage,
            "item": held.key,
            "run": held.owner,
            "running_s": round(held.held_s, 1),
            "usual_s": None if held.usual_s is None else round(held.usual_s, 1),
            "message": held.describe(),
        }
        for held in catalog.store.long_running(load_settings().long_running, project.id)
    ]
    return {
        "project": project.name,
        "stage": project.stage,
        "error": project.error,
        "output_dir": str(project.output_dir),
        "videos": catalog.member_counts().get(project.id, 0),
        "window_minutes": window,
        "stages": stages,
        "frames": frame_counts(engine, project.id),
        "failures": failures,
        "long_running": long_running,
    }


def _print_project_status(data: dict) -> None:
    from dataminer_dagster.core.progress import format_seconds
    from dataminer_dagster.db.schema import STATUSES

    error = f" ({data['error']})" if data["error"] else ""
    click.echo(f"project {data['project']}: {data['stage']}{error}; {data['videos']} videos")
    click.echo(f"output: {data['output_dir']}")
    click.echo("")
    click.echo(
        f"{'stage':<9}"
        + "".join(f"{s:>9}" for s in STATUSES)
        + f"{'per min':>9}  ETA (throughput over the last {data['window_minutes']:g} min)"
    )
    for row in data["stages"]:
        eta = row["eta_s"]
        eta_text = "-" if eta == 0 else "?" if eta is None else format_seconds(eta)
        click.echo(
            f"{row['stage']:<9}"
            + "".join(f"{row[s]:>9}" for s in STATUSES)
            + f"{row['per_minute']:>9.1f}  {eta_text}"
        )
    click.echo("(ETA -: nothing queued; ?: nothing finished in the window)")
    frames = data["frames"]
    click.echo("")
    click.echo(
        f"frames: {frames['extracted']} extracted, {frames['passed_filter']} passed the filter, "
        f"{frames['kept_after_dedup']} kept after dedup, {frames['in_dataset']} in the dataset"
    )
    if data["long_running"]:
        click.echo("")
        click.echo("long-running (held far longer than their stage usually takes):")
        for held in data["long_running"]:
            click.echo(f"  {held['message']}")
    if data["failures"]:
        click.echo("")
        click.echo("latest failures:")
        for f in data["failures"]:
            click.echo(
                f"  {f['at']}  {f['stage']} {f['item']}: {f['status']} "
                f"({f['attempts']} attempts): {f['error']}"
            )


OVERVIEW_STAGES = (DOWNLOAD, FRAMES, FILTER)


def _overview(catalog) -> list[dict]:
    from dataminer_dagster.db.status import stage_counts

    counts = catalog.member_counts()
    result = []
    for p in catalog.projects():
        stages = stage_counts(catalog.engine, p.id)
        result.append(
            {
                "project": p.name,
                "stage": p.stage,
                "error": p.error,
                "videos": counts.get(p.id, 0),
                "output_dir": str(p.output_dir),
                "stages": stages,
            }
        )
    return result


def _print_overview(projects: list[dict]) -> None:
    from dataminer_dagster.reporting import FINISHED

    if not projects:
        click.echo("no projects yet: dataminer project add CONFIG")
        return
    click.echo(
        f"{'project':<24} {'stage':<9} {'videos':>6}"
        + "".join(f" {s:>10}" for s in OVERVIEW_STAGES)
        + f" {'failed':>7} {'dead':>6} {'blocked':>7}"
    )
    for p in projects:
        stages = p["stages"]
        progress = ""
        for stage in OVERVIEW_STAGES:
            statuses = stages.get(stage, {})
            finished = sum(statuses.get(s, 0) for s in FINISHED)
            progress += f" {f'{finished}/{sum(statuses.values())}':>10}"
        problems = {
            s: sum(statuses.get(s, 0) for statuses in stages.values())
            for s in (FAILED, DEAD, BLOCKED)
        }
        error = f"  ({p['error']})" if p["error"] else ""
        click.echo(
            f"{p['project']:<24} {p['stage']:<9} {p['videos']:>6}{progress}"
            f" {problems[FAILED]:>7} {problems[DEAD]:>6} {problems[BLOCKED]:>7}{error}"
        )


def _show_status(project_name: str | None, as_json: bool, window: float) -> None:
    import json

    _, _, catalog = _context()
    if project_name is None:
        projects = _overview(catalog)
        if as_json:
            click.echo(json.dumps({"projects": projects}, indent=2))
        else:
            _print_overview(projects)
        return
    data = _project_status(catalog, _project_or_fail(catalog, project_name), window)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        _print_project_status(data)


def _status_options(command):
    command = click.option(
        "--window",
        type=click.FloatRange(min=0, min_open=True),
        default=15.0,
        show_default=True,
        help="Minutes over which throughput (items finished per minute) is measured.",
    )(command)
    return click.option(
        "--json", "as_json", is_flag=True, help="Print the same data as JSON, for scripts."
    )(command)


@main.command("status")
@click.argument("project_name", metavar="[PROJECT]", required=False)
@_status_options
def status(project_name: str | None, as_json: bool, window: float) -> None:
    """Where the projects are.

    Without PROJECT: one line per project (stage, videos, finished/queued items of the
    per-video stages, problems). With PROJECT: its work items per stage and status, throughput
    (items finished per minute over the last --window minutes) and ETA per stage (queued items
    only), frames kept at each stage, and the latest failures with their reasons.
    """
    _show_status(project_name, as_json, window)


@project.command("status")
@click.argument("name")
@_status_options
def project_status(name: str, as_json: bool, window: float) -> None:
    """The same as `dataminer status NAME`: work items, throughput and ETA per stage, frames,
    latest failures."""
    _show_status(name, as_json, window)


# --- administration ---------------------------------------------------------------------------


def _admin_call(function, *args, **kwargs):
    """Run a db.admin operation, turning its refusals into messages."""
    from dataminer_dagster.db.admin import AdminError

    try:
        return function(*args, **kwargs)
    except AdminError as exc:
        raise UserError(str(exc)) from None


def _report_left_videos(done, files: bool, subject: str) -> None:
    """After a deletion: the videos deleted with their files, or left over as orphans."""
    if files:
        click.echo(f"deleted {len(done.deleted_videos)} videos that no other project used")
        _remove_files(done.files)
    elif done.orphaned:
        click.echo(
            f"{len(done.orphaned)} {subject} are now used by no project; they and their files stay "
            "(dataminer cleanup-orphans --files removes them)"
        )


def _remove_files(paths) -> None:
    from dataminer_dagster.core.files import remove

    for path in paths:
        remove(path)
    if paths:
        click.echo(f"removed {len(paths)} files and directories")


def _confirm(question: str, yes: bool) -> None:
    if not yes:
        click.confirm(question, abort=True)


YES_OPTION = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
FILES_HELP = (
    "the downloaded files, frames and cached embeddings of the videos deleted (only those no "
    "remaining project uses; local source files are never deleted)"
)


@db.command("reset")
@click.option("--yes", is_flag=True, help="Required: confirms that everything is to be dropped.")
def db_reset(yes: bool) -> None:
    """Drop the claim tables (schema `dataminer`) with every project, video and work item, and
    create them again, empty. Files on disk and Dagster's run history are not touched. Refuses
    without --yes."""
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db import admin

    _, store, _ = _context()
    url = redact_url(store.engine.url.render_as_string(hide_password=False))
    before = admin.database_summary(store.engine)
    if not yes:
        raise UserError(
            f"this drops {before.projects} projects, {before.videos} videos and "
            f"{before.work_items} work items in {url}; run again with --yes to do it"
        )
    if before.running:
        click.echo(
            f"warning: {before.running} work items are running; their runs will fail", err=True
        )
    admin.reset_schema(store.engine)
    click.echo(
        f"{url}: dropped {before.projects} projects, {before.videos} videos and "
        f"{before.work_items} work items; the schema is empty and at the latest revision"
    )


@project.command("delete")
@click.argument("name")
@click.option(
    "--files",
    is_flag=True,
    help="Also delete the project's output directory, the videos that no other project uses, "
    "and " + FILES_HELP + ".",
)
@YES_OPTION
def project_delete(name: str, files: bool, yes: bool) -> None:
    """Delete project NAME: its video links and its work items. Videos that no other project
    uses stay in the catalog as orphans (`cleanup-orphans` removes them), unless --files.
    Shared videos and their files always stay. Refused while one of its items (with --files:
    also of the videos it deletes) is running."""
    from dataminer_dagster.db import admin

    _, store, catalog = _context()
    _project_or_fail(catalog, name)

    def delete(dry_run: bool):
        return _admin_call(
            admin.delete_project,
            store.engine,
            catalog.paths,
            name,
            delete_unused_videos=files,
            dry_run=dry_run,
        )

    plan = delete(dry_run=True)
    what = (
        f"project {name} ({plan.videos} videos, "
        f"{len(plan.orphaned)} of them used by no other project)"
    )
    if files:
        what += f" and {len(plan.files)} files and directories"
        if plan.output_dir_kept:
            click.echo(f"its output directory {plan.output_dir} stays: {plan.output_dir_kept}")
        else:
            what += f", the project's results in {plan.output_dir} included"
    _confirm(f"Delete {what}?", yes)
    done = delete(dry_run=False)
    click.echo(f"deleted project {name}")
    _report_left_videos(done, files, "videos")
    if files and not done.output_dir_kept:
        with contextlib.suppress(OSError):  # only when nothing else is left in it
            done.output_dir.rmdir()
    if not files and done.orphaned and done.files:
        click.echo(f"its output directory stays: {done.output_dir} (--files removes it)")


@main.command("delete-videos")
@click.option("--project", "project_name", required=True, help="The project to remove them from.")
@click.option(
    "--status",
    "status_name",
    required=True,
    type=click.Choice(STATUSES, case_sensitive=False),
    help="Remove the videos whose download, extraction or filter item has this status "
    "(any case). Running items are never removed.",
)
@click.option(
    "--files",
    is_flag=True,
    help="Also delete their filter tables in the project's output, the videos that no other "
    "project uses, and " + FILES_HELP + ".",
)
@YES_OPTION
def delete_videos(project_name: str, status_name: str, files: bool, yes: bool) -> None:
    """Remove from a project its videos whose download, extraction or filter item has a given
    status (e.g. every dead video). Their filter items go; videos that no other project uses
    stay in the catalog as orphans, unless --files. Videos with a running item are left alone."""
    from dataminer_dagster.db import admin

    _, store, catalog = _context()
    _project_or_fail(catalog, project_name)
    status_name = status_name.lower()

    def delete(dry_run: bool):
        return _admin_call(
            admin.delete_project_videos,
            store.engine,
            catalog.paths,
            project_name,
            status_name,
            delete_unused_videos=files,
            dry_run=dry_run,
        )

    plan = delete(dry_run=True)
    if plan.skipped_running:
        click.echo(
            f"{len(plan.skipped_running)} {status_name} videos have a running item and are left "
            "alone (running work is never deleted)"
        )
    if not plan.matched:
        click.echo(f"project {project_name}: no {status_name} videos to delete")
        return
    what = f"{len(plan.matched)} {status_name} videos from project {project_name}"
    if files:
        what += f" ({len(plan.deleted_videos)} used by no other project, deleted with their files)"
    _confirm(f"Remove {what}?", yes)
    done = delete(dry_run=False)
    click.echo(f"removed {len(done.matched)} {status_name} videos from project {project_name}")
    _report_left_videos(done, files, "of them")
    if done.had_results and done.project_stage != "active":
        click.echo(
            f"{done.had_results} of them had passed the filter, so the project's dedup, "
            "detections and dataset still include their frames: "
            f"dataminer force-dedup {project_name}"
        )


@main.command("cleanup-orphans")
@click.option("--files", is_flag=True, help="Also delete " + FILES_HELP + ".")
@YES_OPTION
def cleanup_orphans(files: bool, yes: bool) -> None:
    """Delete the videos that no project uses (left by `project delete` and `delete-videos`),
    with their work items. Without --files their files stay on disk. Videos with a running item
    are left for a later cleanup."""
    from dataminer_dagster.db import admin

    _, store, catalog = _context()
    plan = admin.delete_orphan_videos(store.engine, catalog.paths, dry_run=True)
    if plan.skipped_running:
        click.echo(f"{len(plan.skipped_running)} orphan videos have a running item; left alone")
    if not plan.deleted_videos:
        click.echo("no orphan videos to delete")
        return
    what = f"{len(plan.deleted_videos)} videos that no project uses"
    if files:
        what += f" and {len(plan.files)} of their files and directories"
    _confirm(f"Delete {what}?", yes)
    done = admin.delete_orphan_videos(store.engine, catalog.paths)
    click.echo(f"deleted {len(done.deleted_videos)} orphan videos")
    if files:
        _remove_files(done.files)
    elif done.files:
        click.echo(f"{len(done.files)} of their files and directories stay on disk (--files)")


@main.command("retry")
@click.option(
    "--project",
    "project_name",
    default=None,
    help="Only this project's items: its own, and its videos' downloads and extractions.",
)
@click.option(
    "--stage",
    "stages",
    multiple=True,
    type=click.Choice(ALL_STAGES, case_sensitive=False),
    help="Only items of this stage (repeat for several) [default: every stage].",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([FAILED, DEAD, BLOCKED], case_sensitive=False),
    help="Retry items with this status (repeat for several) [default: failed and dead].",
)
def retry(project_name: str | None, stages: tuple[str, ...], statuses: tuple[str, ...]) -> None:
    """Queue failed and dead work items again with fresh attempts (blocked ones with --status
    blocked). Running and done items are not touched. A failed project whose project-level item
    is queued again goes back to that stage."""
    from dataminer_dagster.db import admin

    _, store, _ = _context()
    result = _admin_call(
        admin.retry,
        store,
        project=project_name,
        stages=[s.lower() for s in stages] or None,
        statuses=[s.lower() for s in statuses] or (FAILED, DEAD),
    )
    scope = f" of project {project_name}" if project_name else ""
    click.echo(f"{result.items} work items{scope} queued again")
    for name, stage in result.reopened:
        click.echo(f"project {name}: failed -> {stage}")


def _force(name: str, stage: str) -> None:
    from dataminer_dagster.db import admin

    _, _, catalog = _context()
    forced = _admin_call(admin.force_stage, catalog, name, stage)
    click.echo(f"project {name}: {forced.previous_stage} -> {stage}; {stage} is queued")
    if forced.frames_released:
        click.echo(
            f"note: the frames of {len(forced.frames_released)} of its videos were released "
            "(backup or cleanup); they are extracted and filtered again first",
            err=True,
        )
    if forced.earlier_not_done:
        click.echo(
            f"note: {', '.join(forced.earlier_not_done)} has not finished for this project, and "
            f"{stage} reads its result (dataminer force-dedup {name} runs it first)",
            err=True,
        )
    if forced.unfinished_members:
        click.echo(
            f"note: {forced.unfinished_members} of its videos are not finished; the project goes "
            "back to active until they are (dataminer status " + name + ")",
            err=True,
        )


@main.command("force-dedup")
@click.argument("name")
def force_dedup(name: str) -> None:
    """Run deduplication of project NAME again (then detection and the dataset), whatever its
    stage: after changing dedup settings, or to get a failed project going. Refused while its
    dedup, detection or dataset item is running."""
    _force(name, "dedup")


@main.command("force-detect")
@click.argument("name")
def force_detect(name: str) -> None:
    """Run detection of project NAME again (then the dataset), whatever its stage. Refused
    while its detection or dataset item is running."""
    _force(name, "detect")


# --- the Dagster UI and exports ---------------------------------------------------------------


def _editable_checkout() -> Path | None:
    """The source checkout this package is installed from in editable mode, if it is."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlsplit

    try:
        raw = metadata.distribution("dataminer-dagster").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    info = json.loads(raw) if raw else {}
    url = urlsplit(info.get("url", ""))
    if not info.get("dir_info", {}).get("editable") or url.scheme != "file":
        return None
    return Path(unquote(url.path))


def _dev_plan(settings) -> tuple[Path, Path, Path | None]:
    """(workspace.yaml, DAGSTER_HOME, the dagster.yaml to copy into it or None)."""
    import os

    checkout = _editable_checkout()
    repository = checkout if checkout and (checkout / "workspace.yaml").is_file() else None
    if repository is None and (Path.cwd() / "workspace.yaml").is_file():
        repository = Path.cwd()
    if repository is None:
        raise UserError(
            "no workspace.yaml: run `dataminer dev` from the dataminer-dagster repository, or "
            "install it from a checkout with `pip install -e .`"
        )
    workspace = repository / "workspace.yaml"
    if os.environ.get("DAGSTER_HOME"):
        return workspace, Path(os.environ["DAGSTER_HOME"]).expanduser().resolve(), None
    if repository == checkout and (checkout / "dagster.yaml").is_file():
        return workspace, checkout, None
    source = repository / "dagster.yaml"
    return workspace, settings.home / "dagster", source if source.is_file() else None


@main.command("dev", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--dry-run", is_flag=True, help="Only print the command and its environment.")
@click.argument("dagster_args", nargs=-1, type=click.UNPROCESSED)
def dev(dry_run: bool, dagster_args: tuple[str, ...]) -> None:
    """Run `dagster dev -w <repository>/workspace.yaml`: the Dagster UI, and the sensors that
    drive every registered project. Other arguments go to `dagster dev` (e.g. `-p 3001`).

    DAGSTER_HOME, unless set, is the repository itself (its dagster.yaml: Dagster's storage in
    the same PostgreSQL) when this package is installed editable from a checkout; otherwise
    $DATAMINER_HOME/dagster, with a copy of the repository's dagster.yaml.
    """
    import os
    import shutil
    import subprocess
    import sys

    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    workspace, dagster_home, copy_from = _dev_plan(settings)
    executable = Path(sys.executable).with_name("dagster")
    command = [
        str(executable) if executable.is_file() else (shutil.which("dagster") or "dagster"),
        "dev",
        "-w",
        str(workspace),
        *dagster_args,
    ]
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        # Absolute, so that the code server (working directory: the repository) sees the same.
        "DATAMINER_HOME": str(settings.home),
        "DATAMINER_DATA_DIR": str(settings.data_dir),
    }
    if copy_from is not None:
        click.echo(f"dev: {'would copy' if dry_run else 'copying'} {copy_from} to {dagster_home}")
        if not dry_run:
            dagster_home.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(copy_from, dagster_home / "dagster.yaml")
    click.echo(f"dev: DAGSTER_HOME={dagster_home}")
    click.echo(f"dev: DATAMINER_HOME={settings.home} DATAMINER_DATA_DIR={settings.data_dir}")
    click.echo(f"dev: {'would run' if dry_run else 'running'}: {' '.join(command)}")
    if dry_run:
        return
    process = subprocess.Popen(command, env=env)
    while True:
        try:
            raise SystemExit(process.wait())
        except KeyboardInterrupt:
            continue  # dagster dev got the same interrupt and shuts down in its own time


def _export_dataset(dataset: Path, dest: Path, *, copy: bool) -> tuple[int, int]:
    """Build the export beside DEST and rename it into place; returns (images, hard links)."""
    import shutil

    from dataminer_dagster.core.files import link_or_copy, publish, staging_path

    staging = staging_path(dest)
    (staging / "images").mkdir(parents=True)
    images = sorted((dataset / "images").iterdir()) if (dataset / "images").is_dir() else []
    links = 0
    for image in images:
        source, target = image.resolve(), staging / "images" / image.name
        if copy:
            shutil.copy2(source, target)
        else:
            links += link_or_copy(source, target)
    for name in ("annotations.coco.json", "manifest.parquet"):
        if (dataset / name).is_file():
            shutil.copy2(dataset / name, staging / name)
    publish(staging, dest)
    return len(images), links


@main.command("export")
@click.argument("name")
@click.argument("dest", type=click.Path(path_type=Path))
@click.option(
    "--link",
    "link_images",
    is_flag=True,
    help="Hard-link the images instead of copying them, where DEST shares the frame store's "
    "filesystem (no extra space; the links are the frame store's own read-only files, so an "
    "edit in place by root would change the frame store and every dataset that uses them).",
)
def export(name: str, dest: Path, link_images: bool) -> None:
    """Export project NAME's dataset to DEST, a new or empty directory: images/ (copies, yours
    to edit), annotations.coco.json (when the project detects) and manifest.parquet."""
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = _context()
    project = _project_or_fail(catalog, name)
    dataset = ProjectPaths(project.output_dir).dataset_dir
    if not (dataset / "manifest.parquet").is_file():
        raise UserError(
            f"project {name} has no dataset yet (stage {project.stage}); make it with "
            "`dataminer run CONFIG` (or `dataminer dev` and its sensors); "
            f"see `dataminer status {name}`"
        )
    dest = dest.expanduser().resolve()
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise UserError(f"{dest} already exists and is not an empty directory; choose a new one")
    images, links = _export_dataset(dataset, dest, copy=not link_images)
    how = f"{links} hard links, {images - links} copies" if link_images else "copied"
    click.echo(f"exported {images} images ({how}) of project {name} to {dest}")


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

    from dataminer_dagster import services as svc
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    supervisor = svc.supervisor_for_home()
    try:
        supervisor.require_config()
        # The sensors expect the claim tables; this also creates the embedded database once,
        # before several programs race to do it.
        url = claims_database_url(load_settings())
        try:
            migrate.ensure_schema(get_engine(url))
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
