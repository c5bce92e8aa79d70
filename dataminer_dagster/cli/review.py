"""`dataminer review`: a project's dataset out to a labelling tool and the corrections back.

export   Label Studio tasks with the boxes as predictions, its labelling interface, and the
         COCO file a CVAT task imports, in a folder
import   a Label Studio JSON export or a CVAT COCO export, as corrections: the dataset is
         built again with them (a new version where its content changed)
push     the tasks into a running Label Studio, as a new project, through its API
pull     that project's answers back, as `import` does with an export file
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from dataminer_dagster.cli.app import UserError, context, main, project_or_fail

TASKS_FILE = "tasks.json"
LABEL_CONFIG_FILE = "labeling.xml"
CVAT_COCO_FILE = "annotations.coco.json"
LOCAL_FILES_URL = "/data/local-files/?d="
LABEL_STUDIO_FILE = "label_studio.json"  # in the review folder: the project pushed, for pull


def option_group(*options):
    """One decorator for a group of click options, in the order given."""

    def apply(command):
        for option in reversed(options):
            command = option(command)
        return command

    return apply


@main.group()
def review() -> None:
    """Review a project's dataset in Label Studio or CVAT and bring the corrections back."""


def _dataset(name: str):
    """The project, its paths and its published dataset's contents."""
    from dataminer_dagster.assets.dataset.dataset_files import MANIFEST_FILE
    from dataminer_dagster.assets.dataset.dataset_formats import read_contents
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    project = project_or_fail(catalog, name)
    paths = ProjectPaths(project.output_dir)
    if not (paths.dataset_dir / MANIFEST_FILE).is_file():
        raise UserError(
            f"project {name} has no dataset yet (stage {project.stage}): make it with "
            "`dataminer run CONFIG` first"
        )
    return project, paths, read_contents(paths.dataset_dir)


def image_urls(images: Path, image_url: str | None, document_root: Path | None):
    """Where the labelling tool loads each image of the folder `images` from: under
    `image_url`, or through Label Studio's local files, relative to its
    LOCAL_FILES_DOCUMENT_ROOT."""
    from urllib.parse import quote

    images = images.resolve()
    if image_url:
        prefix = image_url.rstrip("/") + "/"
        return lambda name: prefix + quote(name)
    root = (document_root or Path("/")).expanduser().resolve()
    try:
        relative = images.relative_to(root)
    except ValueError:
        raise UserError(f"the images ({images}) are not under the document root {root}") from None
    return lambda name: LOCAL_FILES_URL + quote(f"{relative.as_posix()}/{name}")


def _image_url(paths, image_url: str | None, document_root: Path | None):
    from dataminer_dagster.assets.dataset.dataset_files import IMAGES_DIR

    return image_urls(paths.dataset_dir / IMAGES_DIR, image_url, document_root)


def _model_version(project, paths) -> str:
    from dataminer_dagster.assets.dataset.dataset_files import VERSION_FILE

    version = json.loads((paths.dataset_dir / VERSION_FILE).read_text())["version"]
    detector = project.config.detect
    made_by = f"{detector.detector} {detector.model}" if detector else "no detector"
    return f"dataminer {project.name} v{version} ({made_by})"


def image_options(images: str):
    """The options that say where a labelling tool loads `images` (a folder, in words) from."""
    return option_group(
        click.option(
            "--image-url",
            help="Where the tool loads the images from: this URL followed by the image's file "
            f"name (a web server over {images}). Default: Label Studio's local files.",
        ),
        click.option(
            "--document-root",
            type=click.Path(path_type=Path, file_okay=False),
            help="Label Studio's LOCAL_FILES_DOCUMENT_ROOT, which the local-files URLs are "
            "relative to [default: /].",
        ),
    )


@review.command("export")
@click.argument("name")
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
@image_options("the dataset's images/")
def export(name: str, dest: Path, image_url: str | None, document_root: Path | None) -> None:
    """Write project NAME's dataset for review into folder DEST: tasks.json (Label Studio tasks,
    the boxes as predictions), labeling.xml (its labelling interface) and
    annotations.coco.json (for a CVAT task: its images are the dataset's images/)."""
    import shutil

    from dataminer_dagster.assets.dataset.dataset_files import COCO_FILE, IMAGES_DIR
    from dataminer_dagster.assets.dataset.review_formats import (
        label_studio_config,
        label_studio_tasks,
    )
    from dataminer_dagster.core.files import publish, staging_path

    project, paths, contents = _dataset(name)
    tasks = label_studio_tasks(
        contents, _image_url(paths, image_url, document_root), _model_version(project, paths)
    )
    dest = dest.expanduser().resolve()
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise UserError(f"{dest} already exists and is not an empty folder; choose a new one")
    staging = staging_path(dest)  # built aside, renamed into place: never half-written
    staging.mkdir()
    (staging / TASKS_FILE).write_text(json.dumps(tasks, indent=1))
    (staging / LABEL_CONFIG_FILE).write_text(label_studio_config(contents.names))
    if (paths.dataset_dir / COCO_FILE).is_file():
        shutil.copyfile(paths.dataset_dir / COCO_FILE, staging / CVAT_COCO_FILE)
    publish(staging, dest)
    boxes = sum(len(i.boxes) for i in contents.images)
    click.echo(f"{len(tasks)} images with {boxes} boxes of project {name} in {dest}:")
    click.echo(f"  {TASKS_FILE}: Label Studio tasks (import them into a project whose labelling")
    click.echo(f"    interface is {LABEL_CONFIG_FILE}); its JSON export comes back with")
    click.echo(f"    `dataminer review import {name} EXPORT.json`")
    if (dest / CVAT_COCO_FILE).is_file():
        click.echo(f"  {CVAT_COCO_FILE}: for CVAT (images: {paths.dataset_dir / IMAGES_DIR});")
        click.echo("    its 'COCO 1.0' export comes back the same way")


def _import_and_rebuild(name: str, export: Path, wait: bool, timeout: float | None) -> None:
    """Keep the export's answers as corrections and queue the dataset again (build it now with
    `wait`)."""
    from dataminer_dagster.assets.dataset.corrections import import_review
    from dataminer_dagster.assets.dataset.review_formats import (
        REVIEW_STATES,
        UNREVIEWED,
        ReviewImportError,
    )
    from dataminer_dagster.cli.admin import force_and_report
    from dataminer_dagster.registry import DATASET

    project, paths, _ = _dataset(name)
    try:
        done = import_review(export, paths.dataset_dir, paths.review_dir)
    except ReviewImportError as error:
        raise UserError(f"project {name}: {error}; nothing was imported") from None
    states = ", ".join(f"{done.summary.states[s]} {s}" for s in REVIEW_STATES if s != UNREVIEWED)
    click.echo(f"imported the review of {done.images} images ({done.format}): {states}")
    classes = done.summary.classes.values()
    before, corrections = sum(c.predicted for c in classes), sum(c.corrections for c in classes)
    click.echo(f"  {corrections} box corrections to {before} boxes")
    for label, c in sorted(done.summary.classes.items()):
        if c.corrections:
            click.echo(
                f"  {label}: {c.predicted} boxes, {c.moved} moved, {c.relabelled} relabelled, "
                f"{c.deleted} deleted, {c.added} added ({c.rate:.0%} corrected)"
            )
    try:
        force_and_report(name, DATASET)
    except UserError as refused:
        raise UserError(
            f"{refused.message}\nthe corrections are kept (in {paths.review_dir}): "
            f"`dataminer force-dataset {name}` builds the dataset with them once it can"
        ) from None
    if not wait:
        click.echo(
            f"the dataset is queued to be built again with the corrections: `dataminer run` of "
            f"the project's config, or the sensors of `dataminer dev`, make it "
            f"(`dataminer dataset diff {name}` then shows what changed)"
        )
        return
    from dataminer_dagster.cli.running import run_projects

    code = run_projects([project.config], timeout=timeout, progress=False)
    if code == 0:
        from dataminer_dagster.assets.dataset.dataset_versions import list_versions

        latest = list_versions(paths.dataset_versions_dir)[-1]
        click.echo(f"dataset of {name} is v{latest.number} ({latest.images} images)")
    raise SystemExit(code)


_wait_options = option_group(
    click.option(
        "--wait/--no-wait",
        default=True,
        show_default=True,
        help="Build the dataset again now, in this process (--no-wait: queue it for the "
        "sensors or the next `dataminer run`).",
    ),
    click.option("--timeout", type=float, help="Give up waiting after this many seconds."),
)


@review.command("import")
@click.argument("name")
@click.argument("export", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_wait_options
def import_command(name: str, export: Path, wait: bool, timeout: float | None) -> None:
    """Bring the review of project NAME's dataset back from EXPORT: Label Studio's JSON export
    or CVAT's COCO export. Images are matched by their file name; an export that does not fit
    the dataset changes nothing. Rejected images leave the dataset, corrected boxes replace the
    detector's, and the dataset is built again (a new version where its content changed)."""
    _import_and_rebuild(name, export, wait, timeout)


def label_studio(url: str | None, token: str | None):
    from dataminer_dagster.assets.dataset.label_studio import LabelStudio

    if not url or not token:
        raise UserError(
            "say where Label Studio is and how to sign in: --url and --token (or "
            "LABEL_STUDIO_URL and LABEL_STUDIO_API_KEY); the token is on its Account & "
            "Settings page"
        )
    return LabelStudio(url, token)


server_options = option_group(
    click.option(
        "--url",
        envvar="LABEL_STUDIO_URL",
        help="Label Studio's address, e.g. http://localhost:8080 [env LABEL_STUDIO_URL].",
    ),
    click.option(
        "--token",
        envvar="LABEL_STUDIO_API_KEY",
        help="An API token of Label Studio: legacy or personal access token "
        "[env LABEL_STUDIO_API_KEY].",
    ),
)


@review.command("push")
@click.argument("name")
@server_options
@image_options("the dataset's images/")
@click.option("--title", help="The Label Studio project's title [default: dataminer NAME vN].")
def push(
    name: str,
    url: str | None,
    token: str | None,
    image_url: str | None,
    document_root: Path | None,
    title: str | None,
) -> None:
    """Send project NAME's dataset to a running Label Studio as a new project: its images as
    tasks, its boxes as predictions. Without --image-url, Label Studio serves the images
    itself: start it with LOCAL_FILES_SERVING_ENABLED=true and LOCAL_FILES_DOCUMENT_ROOT (pass
    the same folder as --document-root) on a machine that sees the dataset's folder."""
    from dataminer_dagster.assets.dataset.dataset_files import IMAGES_DIR
    from dataminer_dagster.assets.dataset.label_studio import LabelStudioError
    from dataminer_dagster.assets.dataset.review_formats import (
        label_studio_config,
        label_studio_tasks,
    )

    project, paths, contents = _dataset(name)
    model_version = _model_version(project, paths)
    tasks = label_studio_tasks(contents, _image_url(paths, image_url, document_root), model_version)
    title = title or model_version.split(" (")[0]
    try:
        client = label_studio(url, token)
        project_id = client.create_project(title, label_studio_config(contents.names))
        if not image_url:
            images = (paths.dataset_dir / IMAGES_DIR).resolve()
            client.connect_local_files(project_id, str(images), f"{name} images")
        taken = client.import_tasks(project_id, tasks)
    except LabelStudioError as error:
        raise UserError(str(error)) from None
    paths.review_dir.mkdir(parents=True, exist_ok=True)
    (paths.review_dir / LABEL_STUDIO_FILE).write_text(
        json.dumps({"url": client.url, "project": project_id, "title": title}, indent=1) + "\n"
    )
    click.echo(
        f"{taken} tasks of project {name} in Label Studio: {client.url}/projects/{project_id}"
    )
    click.echo(f"when reviewed: dataminer review pull {name}")


@review.command("pull")
@click.argument("name")
@server_options
@click.option(
    "--project",
    "project_id",
    type=int,
    help="The Label Studio project [default: the one `review push` made for NAME].",
)
@_wait_options
def pull(
    name: str,
    url: str | None,
    token: str | None,
    project_id: int | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Bring the answers of project NAME's Label Studio project back, as `review import` does
    with an export file (which is kept in the project's review/ folder)."""
    from datetime import UTC, datetime

    from dataminer_dagster.assets.dataset.label_studio import LabelStudioError
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    paths = ProjectPaths(project_or_fail(catalog, name).output_dir)
    pushed = paths.review_dir / LABEL_STUDIO_FILE
    known = json.loads(pushed.read_text()) if pushed.is_file() else {}
    same_server = not url or url.rstrip("/") == known.get("url")
    if project_id is None and known and not same_server:
        raise UserError(
            f"{name} was pushed to {known['url']} (project {known['project']}), not {url}: "
            "name the project there with --project"
        )
    project_id = project_id or known.get("project")
    if project_id is None:
        raise UserError(f"no Label Studio project known for {name}: push it first, or --project")
    try:
        client = label_studio(url or known.get("url"), token)
        answers = client.export_answers(project_id)
    except LabelStudioError as error:
        raise UserError(str(error)) from None
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    export = paths.review_dir / f"label-studio-{project_id}-{stamp}.json"
    export.write_text(json.dumps(answers))
    click.echo(f"{len(answers)} answered tasks from Label Studio project {project_id} ({export})")
    _import_and_rebuild(name, export, wait, timeout)
