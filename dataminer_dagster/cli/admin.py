"""Deleting and repairing: `project delete`, `delete-videos`, `cleanup-orphans`, `retry` and
`force-<stage>` (one per forceable stage of the registry)."""

from __future__ import annotations

import contextlib

import click

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.cli.app import UserError, context, main, project_or_fail
from dataminer_dagster.cli.projects import project
from dataminer_dagster.db.schema import BLOCKED, DEAD, FAILED, STATUSES


def _admin_call(function, *args, **kwargs):
    """Run a db.admin operation, turning its refusals into messages."""
    from dataminer_dagster.db.deletions import AdminError

    try:
        return function(*args, **kwargs)
    except AdminError as exc:
        raise UserError(str(exc)) from None


def _report_left_videos(done, files: bool, subject: str) -> None:
    """After a deletion: the videos deleted with their files, or left over as orphans."""
    if files:
        click.echo(f"deleted {len(done.deleted_videos)} videos that no other project used")
        if done.files:
            click.echo(f"removed {len(done.files)} files and directories")
    elif done.orphaned:
        click.echo(
            f"{len(done.orphaned)} {subject} are now used by no project; they and their files stay "
            "(dataminer cleanup-orphans --files removes them)"
        )


def _confirm(question: str, yes: bool) -> None:
    if not yes:
        click.confirm(question, abort=True)


YES_OPTION = click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
FILES_HELP = (
    "the downloaded files, frames and cached embeddings of the videos deleted (only those no "
    "remaining project uses; local source files are never deleted)"
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
    from dataminer_dagster.db import deletions

    _, store, catalog = context()
    project_or_fail(catalog, name)

    def delete(dry_run: bool):
        return _admin_call(
            deletions.delete_project,
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
    stay in the catalog as orphans, unless --files. Videos with a running item are left alone;
    nothing is removed while the project's dedup, detect or dataset runs (it reads them)."""
    from dataminer_dagster.db import deletions

    _, store, catalog = context()
    project_or_fail(catalog, project_name)
    status_name = status_name.lower()

    def delete(dry_run: bool):
        return _admin_call(
            deletions.delete_project_videos,
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
@click.option(
    "--files",
    is_flag=True,
    help="Also delete " + FILES_HELP + ". Without it, the videos with files on disk stay.",
)
@YES_OPTION
def cleanup_orphans(files: bool, yes: bool) -> None:
    """Delete the videos that no project uses (left by `project delete` and `delete-videos`),
    with their work items. Without --files only those with nothing on disk are deleted: the
    others stay in the catalog, so that `cleanup-orphans --files` can still find their files
    and delete them too. Videos with a running item are left for a later cleanup."""
    from dataminer_dagster.db import deletions

    _, store, catalog = context()
    plan = deletions.delete_orphan_videos(
        store.engine, catalog.paths, remove_files=files, dry_run=True
    )
    if plan.skipped_running:
        click.echo(f"{len(plan.skipped_running)} orphan videos have a running item; left alone")
    if plan.kept_with_files:
        click.echo(
            f"{len(plan.kept_with_files)} orphan videos have files on disk; they stay until "
            "dataminer cleanup-orphans --files deletes them with their files"
        )
    if not plan.deleted_videos:
        click.echo(
            "no orphan videos to delete" + (" without --files" if plan.kept_with_files else "")
        )
        return
    what = f"{len(plan.deleted_videos)} videos that no project uses"
    if files:
        what += f" and {len(plan.files)} of their files and directories"
    _confirm(f"Delete {what}?", yes)
    done = deletions.delete_orphan_videos(store.engine, catalog.paths, remove_files=files)
    click.echo(f"deleted {len(done.deleted_videos)} orphan videos")
    if done.files:
        click.echo(f"removed {len(done.files)} files and directories")


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
    type=click.Choice(REGISTRY.names, case_sensitive=False),
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
    from dataminer_dagster.db import project_lifecycle

    _, store, _ = context()
    result = _admin_call(
        project_lifecycle.retry,
        store,
        project=project_name,
        stages=[s.lower() for s in stages] or None,
        statuses=[s.lower() for s in statuses] or (FAILED, DEAD),
    )
    scope = f" of project {project_name}" if project_name else ""
    click.echo(f"{result.items} work items{scope} queued again")
    for name, stage in result.reopened:
        click.echo(f"project {name}: failed -> {stage}")


def force_and_report(name: str, stage: str) -> None:
    """Force project NAME's `stage` (db/project_lifecycle.py) and say what it set going."""
    from dataminer_dagster.db import project_lifecycle

    _, _, catalog = context()
    forced = _admin_call(project_lifecycle.force_stage, catalog, name, stage)
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


def _force_command(stage: str) -> None:
    """`dataminer force-<stage> NAME` for a forceable stage of the registry."""
    chain = REGISTRY.project_chain
    after = chain[chain.index(stage) + 1 :]
    then = f" (then {', '.join(after)})" if after else ""

    @main.command(
        f"force-{stage}",
        help=f"Run {stage} ({REGISTRY[stage].description}) of project NAME again{then}, "
        "whatever its stage: after changing its settings, or to get a failed project going. "
        f"Refused while its {' or '.join((stage, *after))} item is running.",
    )
    @click.argument("name")
    def force(name: str) -> None:
        force_and_report(name, stage)


for _stage in REGISTRY.forceable:
    _force_command(_stage)
