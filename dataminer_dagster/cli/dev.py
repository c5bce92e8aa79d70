"""`dataminer dev` (the Dagster UI with the sensors), `dataminer export` (a project's dataset) and
`dataminer dataset` (its versions)."""

from __future__ import annotations

from pathlib import Path

import click

from dataminer_dagster.cli.app import UserError, context, main, project_or_fail


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
    from dataminer_dagster.hosting.supervisord import resolve_dagster_home

    checkout = _editable_checkout()
    repository = checkout if checkout and (checkout / "workspace.yaml").is_file() else None
    if repository is None and (Path.cwd() / "workspace.yaml").is_file():
        repository = Path.cwd()
    if repository is None:
        raise UserError(
            "no workspace.yaml: run `dataminer dev` from the dataminer-dagster repository, or "
            "install it from a checkout with `pip install -e .`"
        )
    own_home = checkout if repository == checkout else None
    home, copy_from = resolve_dagster_home(settings, repository, checkout=own_home)
    return repository / "workspace.yaml", home, copy_from


def _dev_executable() -> str:
    """`dg` (dagster-dg-cli, the dev extra: what Dagster 1.13 recommends), else `dagster`, whose
    `dev` prints a SupersessionWarning pointing at `dg dev`."""
    import shutil
    import sys

    for name in ("dg", "dagster"):
        beside = Path(sys.executable).with_name(name)
        if beside.is_file():
            return str(beside)
        if shutil.which(name):
            return shutil.which(name)
    return "dagster"


@main.command("dev", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--dry-run", is_flag=True, help="Only print the command and its environment.")
@click.argument("dagster_args", nargs=-1, type=click.UNPROCESSED)
def dev(dry_run: bool, dagster_args: tuple[str, ...]) -> None:
    """Run `dg dev -w <repository>/workspace.yaml` (`dagster dev` where dagster-dg-cli is not
    installed): the Dagster UI, and the sensors that drive every registered project. Other
    arguments go to it (e.g. `-p 3001`).

    DAGSTER_HOME, unless set, is the repository itself (its dagster.yaml: Dagster's storage in
    the same PostgreSQL) when this package is installed editable from a checkout; otherwise
    $DATAMINER_HOME/dagster, with a copy of the repository's dagster.yaml.
    """
    import os
    import shutil
    import subprocess

    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    workspace, dagster_home, copy_from = _dev_plan(settings)
    command = [
        _dev_executable(),
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
@click.option(
    "--format",
    "formats",
    multiple=True,
    type=click.Choice(["coco", "yolo", "hf"]),
    help="A training format to write per split (repeat for more): coco (coco/<split>.json), "
    "yolo (Ultralytics: yolo/data.yaml, images/, labels/), hf (Hugging Face imagefolder: "
    "hf/<split>/ with metadata.jsonl). Default: the project's dataset.formats.",
)
def export(name: str, dest: Path, link_images: bool, formats: tuple[str, ...]) -> None:
    """Export project NAME's dataset to DEST, a new or empty directory: images/ (copies, yours
    to edit), annotations.coco.json (when the project detects), manifest.parquet (with each
    image's split), the quality report, and the training formats, written for DEST (their
    images are hard links to DEST's images/)."""
    from dataminer_dagster.assets.dataset.dataset_files import MANIFEST_FILE
    from dataminer_dagster.assets.dataset.dataset_formats import DatasetFormatError, export_dataset
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    project = project_or_fail(catalog, name)
    dataset = ProjectPaths(project.output_dir).dataset_dir
    if not (dataset / MANIFEST_FILE).is_file():
        raise UserError(
            f"project {name} has no dataset yet (stage {project.stage}); make it with "
            "`dataminer run CONFIG` (or `dataminer dev` and its sensors); "
            f"see `dataminer status {name}`"
        )
    chosen = list(formats or project.config.dataset.formats)
    dest = dest.expanduser().resolve()
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise UserError(f"{dest} already exists and is not an empty directory; choose a new one")
    try:
        images, links, written = export_dataset(dataset, dest, copy=not link_images, formats=chosen)
    except DatasetFormatError as error:
        raise UserError(f"project {name}: {error}") from None
    how = f"{links} hard links, {images - links} copies" if link_images else "copied"
    click.echo(f"exported {images} images ({how}) of project {name} to {dest}")
    for fmt, counts in written.images.items():
        click.echo(f"  {fmt}: " + ", ".join(f"{s} {n}" for s, n in counts.items()) + " images")
    for note in written.notes:
        click.echo(f"  note: {note}")


@main.group()
def dataset() -> None:
    """A project's dataset versions: every build whose content changed is kept."""


@dataset.command("versions")
@click.argument("name")
def dataset_versions(name: str) -> None:
    """List the kept versions of project NAME's dataset, oldest first."""
    from dataminer_dagster.assets.dataset.dataset_versions import list_versions
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    project = project_or_fail(catalog, name)
    folder = ProjectPaths(project.output_dir).dataset_versions_dir
    versions = list_versions(folder)
    if not versions:
        raise UserError(f"project {name} has no dataset version yet; make its dataset first")
    for v in versions:
        click.echo(f"v{v.number}  {v.created_at}  {v.images} images  {v.content_hash[:12]}")
    click.echo(f"in {folder}")


@dataset.command("diff")
@click.argument("name")
@click.option("--from", "old", type=int, help="The earlier version (default: the one before --to).")
@click.option("--to", "new", type=int, help="The later version (default: the latest).")
@click.option("--show", type=int, default=5, show_default=True, help="File names shown per kind.")
def dataset_diff(name: str, old: int | None, new: int | None, show: int) -> None:
    """What was added, removed, relabelled and moved to another split between two versions of
    project NAME's dataset (images matched by file name: a frame's video and index)."""
    from dataminer_dagster.assets.dataset.dataset_versions import (
        DatasetVersionError,
        diff_versions,
        list_versions,
    )
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    project = project_or_fail(catalog, name)
    folder = ProjectPaths(project.output_dir).dataset_versions_dir
    numbers = [v.number for v in list_versions(folder)]
    new = new if new is not None else (numbers[-1] if numbers else 1)
    old = old if old is not None else new - 1
    try:
        found = diff_versions(folder, old, new)
    except DatasetVersionError as error:
        raise UserError(f"project {name}: {error}") from None
    for line in found.lines(show):
        click.echo(line)
