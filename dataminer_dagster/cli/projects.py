"""`dataminer project add|list`, `add-video`, `refresh` and `populate`: registering projects and
their videos."""

from __future__ import annotations

import click

from dataminer_dagster.cli.app import UserError, context, load_config, main
from dataminer_dagster.cli.registration import registration_lines


@main.group()
def project() -> None:
    """Register and inspect projects."""


@project.command("add")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
def project_add(config: str) -> None:
    """Register a project from its YAML CONFIG, or update it. A new project's video catalog is
    queued; a changed config makes stale the work it changes, which runs again, and only that
    (new prompts: the filter from cached embeddings, then dedup, detection and the dataset; a new
    output_dir: the results move there). With `dg dev` running, the sensors take it from there."""
    cfg = load_config(config)
    settings, _, catalog = context()
    result = catalog.projects.register(cfg, protected=settings.protected_dirs)
    for line in registration_lines(result):
        click.echo(line)


@project.command("list")
def project_list() -> None:
    """One line per project: stage, videos, output directory."""
    _, _, catalog = context()
    projects = catalog.projects.all()
    if not projects:
        click.echo("no projects yet: dataminer project add CONFIG")
        return
    counts = catalog.projects.member_counts()
    click.echo(f"{'project':<24} {'stage':<10} {'videos':>7}  output")
    for p in projects:
        click.echo(f"{p.name:<24} {p.stage:<10} {counts.get(p.id, 0):>7}  {p.output_dir}")


@main.command("add-video")
@click.argument("url")
@click.option("--project", "project_name", required=True, help="Name of an existing project.")
def add_video(url: str, project_name: str) -> None:
    """Add one video URL to an existing project."""
    from dataminer_dagster.acquisition.video_ids import (
        Candidate,
        is_youtube_url,
        video_id_for_url,
        youtube_watch_url,
    )

    _, _, catalog = context()
    proj = catalog.projects.get(project_name)
    if proj is None:
        raise UserError(f"no project named {project_name!r} (dataminer project list)")
    try:
        video_id = video_id_for_url(url)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    canonical = youtube_watch_url(video_id) if is_youtube_url(url) else url
    with catalog.engine.begin() as conn:
        linked = catalog.link_and_queue(
            conn, proj, [Candidate(video_id, "manual", "add-video", url=canonical)]
        )
    state = "added" if linked.new_links else "already in the project (re-queued if it had failed)"
    click.echo(f"video {video_id} {state}: {project_name}")


@main.command()
@click.argument("name")
@click.option(
    "--wait",
    is_flag=True,
    help="Run the refresh in this process, as `dataminer run` does, until the project is "
    "finished again (without it, the sensors of a running `dg dev` or daemon take it).",
)
@click.option(
    "--timeout", type=float, default=None, help="With --wait: give up after this many seconds."
)
def refresh(name: str, wait: bool, timeout: float | None) -> None:
    """List the sources of project NAME again (searches, listings, URL files) and take only the
    videos it has not seen; a finished project reopens for them. A refresh that finds nothing new
    downloads nothing."""
    from dataminer_dagster.db.source_refresh import request_refresh

    _, store, catalog = context()
    project = catalog.projects.get(name)
    if project is None:
        raise UserError(f"no project named {name!r} (dataminer project list)")
    request = request_refresh(store, project.id, name)
    click.echo(f"refresh of {name}: {request.reason}")
    if wait:
        from dataminer_dagster.cli.running import run_projects

        raise SystemExit(run_projects([project.config], timeout=timeout, progress=False))


@main.command()
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Only print what would be added.")
def populate(config: str, dry_run: bool) -> None:
    """Find the videos of a project's inputs (searches, URLs, files) and add them."""
    import os

    from dataminer_dagster.assets.catalog.inputs import find_videos
    from dataminer_dagster.core.redact import redact
    from dataminer_dagster.db.schema import DONE
    from dataminer_dagster.db.shared_throttle import SharedThrottle
    from dataminer_dagster.registry import CATALOG
    from dataminer_dagster.resources.download_client import YtDlpClient

    cfg = load_config(config)
    settings, store, catalog = context()
    # As the catalog stage finds them: the project's cookies and proxies, and the host pauses
    # every run shares (a paused host is reported, not asked again).
    found = find_videos(
        cfg.inputs,
        cfg.download,
        YtDlpClient(),
        lambda options: SharedThrottle.for_download(
            store.engine,
            f"cli-populate-{os.getpid()}",
            options,
            stale_after_s=settings.lease.stale_after_s,
        ),
    )
    for problem in found.problems:
        click.echo(f"warning: {problem}", err=True)
    if dry_run:
        click.echo(f"{len(found.candidates)} videos would be added to {cfg.name}:")
        for c in found.candidates:
            click.echo(f"  {c.video_id:<24} {c.source:<9} {redact(c.url or c.source_path)}")
        return
    result = catalog.projects.register(cfg, protected=settings.protected_dirs)
    with catalog.engine.begin() as conn:
        linked = catalog.link_and_queue(conn, result.project, found.candidates)
        catalog.store.mark(
            CATALOG, cfg.name, DONE, "populated by the CLI", project_id=result.project.id, conn=conn
        )
    click.echo(
        f"{cfg.name}: {len(found.candidates)} videos ({linked.new_videos} new to the catalog, "
        f"{linked.new_links} newly linked, {linked.already_linked} already linked); {linked.queued} queued"
    )
