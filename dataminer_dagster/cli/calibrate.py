"""`dataminer calibrate`: choose the filter's positive threshold from a yes/no review of a sample.

export   draw a sample of the project's frames across each prompt's score range and write it
         for review: the frames, Label Studio tasks and their labelling interface; with --more,
         add frames to the sample where they narrow the estimate, its answers kept
import   bring the answers back (Label Studio's JSON export, CVAT's XML export) and report
push     draw a sample and send it into a running Label Studio, as a new project; with --more,
         add frames to the sample and to that project
pull     that project's answers back, as `import` does with an export file
show     report again, for another precision; `--apply` writes the threshold to the config

As `dataminer review`, a round trip through a labelling tool: the review takes a person hours,
so what was drawn and what was answered are kept in the project's calibration/ folder between
the commands, and `show` reports from them without another review.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from dataminer_dagster.cli.app import UserError, context, main, project_or_fail
from dataminer_dagster.cli.review import (
    LABEL_CONFIG_FILE,
    LABEL_STUDIO_FILE,
    TASKS_FILE,
    image_options,
    image_urls,
    label_studio,
    option_group,
    server_options,
)

IMAGES_DIR = "images"
REVIEW_DIR = "review"  # in the calibration folder: what `push` sent to Label Studio (-N: more)
DEFAULT_FRAMES = 48
TABLE_ROWS = 10


@main.group()
def calibrate() -> None:
    """Choose the filter's positive_threshold from a yes/no review of a sample of frames."""


def _project(name: str):
    from dataminer_dagster.paths import ProjectPaths

    _, _, catalog = context()
    project = project_or_fail(catalog, name)
    return catalog, project, ProjectPaths(project.output_dir)


def _population(catalog, project):
    """Every scored frame of the project (assets/filter/table.scored_frames)."""
    from dataminer_dagster.assets.filter.store import filtered_videos
    from dataminer_dagster.assets.filter.table import StaleFilterTable, scored_frames

    videos = filtered_videos(catalog.engine, project.id)
    if not videos:
        raise UserError(
            f"project {project.name} has no filtered frames yet (stage {project.stage}): run it "
            "first with `dataminer run CONFIG`"
        )
    try:
        frames = scored_frames(project, videos)
    except StaleFilterTable as stale:
        raise UserError(
            f"video {stale.video_id} of project {project.name} was filtered with other prompts "
            "than its config has now: let the filter run again first (`dataminer run CONFIG`)"
        ) from None
    if frames.empty:
        raise UserError(f"project {project.name} has no readable frames to calibrate on")
    return frames


_sample_options = (
    click.option(
        "--frames",
        type=click.IntRange(min=2),
        default=DEFAULT_FRAMES,
        show_default=True,
        help="Frames to review: more narrow the intervals.",
    ),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of the draw."),
)
_more_options = (
    click.option(
        "--more",
        is_flag=True,
        help="Add --frames frames to the project's sample instead of drawing a new one: its "
        "answers are kept and only the added frames go out for review. They go to the strata "
        "where they narrow the precision estimate most at the threshold recommended so far.",
    ),
    click.option(
        "--precision",
        type=click.FloatRange(0, 1, min_open=True),
        help="With --more: the precision you will ask for; the frames are aimed at the "
        "threshold recommended for it [default: the best F1's].",
    ),
)


@dataclass(frozen=True)
class _Drawn:
    """What goes out for review: a new sample, or frames added to the project's sample."""

    paths: Any  # the project's (paths.ProjectPaths)
    sampled: Any  # the sample as it is kept (calibration_review.SampledFrames)
    ids: tuple[str, ...]  # the frames that go out for review now
    files: list[str]  # and their files
    more: bool  # frames added to the project's sample, not a new sample
    aim: Any  # with `more`: where they narrow the estimate (calibration.Aim, or None)


def _draw_new(name: str, frames: int, seed: int) -> _Drawn:
    """A new sample of project NAME's frames."""
    from dataminer_dagster.assets.filter.calibration import draw_sample
    from dataminer_dagster.assets.filter.calibration_review import sampled_frames

    catalog, project, paths = _project(name)
    population = _population(catalog, project)
    sample = draw_sample(
        population["pos_max"].to_numpy(), population["best_positive"].to_numpy(), frames, seed
    )
    sampled = sampled_frames(population, sample, project.config.filter, seed)
    files = list(population["file"].iloc[sample.frames])
    return _Drawn(paths, sampled, sampled.ids, files, False, None)


def _draw_more(name: str, frames: int, seed: int, precision: float | None) -> _Drawn:
    """Project NAME's sample with `frames` more frames, where they narrow the precision estimate
    at the threshold its answers recommend (for `precision`, else the best F1)."""
    import numpy as np

    from dataminer_dagster.assets.filter.calibration import (
        aim_more,
        allocate_more,
        assign_strata,
        draw_more,
    )
    from dataminer_dagster.assets.filter.calibration_review import (
        frame_ids,
        load_answers,
        with_more_frames,
    )

    catalog, project, paths = _project(name)
    sampled = _sample(project, paths)
    population = _population(catalog, project)
    position = {frame: k for k, frame in enumerate(frame_ids(population))}
    try:
        if len(population) != sampled.population or not all(i in position for i in sampled.ids):
            raise ValueError("other frames")
        before = np.array([position[i] for i in sampled.ids], np.int64)
        scores = population["pos_max"].to_numpy(np.float32)
        allows = population["rule_allows"].to_numpy(bool)
        same = np.array_equal(scores[before], sampled.score)
        same &= np.array_equal(allows[before], sampled.rule_allows)
        same &= np.array_equal(np.sort(scores[allows]), sampled.allowed_scores)
        if not same:
            raise ValueError("other scores")
        stratum_of = assign_strata(scores, population["best_positive"].to_numpy(), sampled.strata)
    except ValueError:
        raise UserError(
            f"project {name}'s frames or their scores are not those its calibration sample was "
            f"drawn from: draw a new one (`dataminer calibrate export {name} DEST`, without "
            "--more)"
        ) from None
    answers = sampled.answers(load_answers(paths.calibration_dir))
    aim = aim_more(answers, precision)
    drawn = np.bincount(sampled.stratum_of, minlength=len(sampled.strata))
    counts = allocate_more(answers, drawn, frames, aim.threshold if aim else None)
    if not sum(counts):
        raise UserError(f"every frame of project {name} is in its calibration sample already")
    added, strata = draw_more(stratum_of, before, counts, [seed, len(sampled.ids)])
    extended = with_more_frames(sampled, population, added, strata)
    files = list(population["file"].iloc[added])
    return _Drawn(paths, extended, extended.ids[len(sampled.ids) :], files, True, aim)


def _write_for_review(prompts, ids, files, dest: Path, image_url, document_root) -> list[dict]:
    """The frames `ids` (their `files`), their tasks and the labelling interface for `prompts` in
    folder `dest` (built aside, then renamed into place); returns the tasks."""
    import shutil

    from dataminer_dagster.assets.filter.calibration_review import (
        label_studio_config,
        label_studio_tasks,
        save_json,
    )
    from dataminer_dagster.core.files import publish, staging_path

    staging = staging_path(dest)
    (staging / IMAGES_DIR).mkdir(parents=True)
    for frame_file, image in zip(files, ids, strict=True):
        shutil.copyfile(frame_file, staging / IMAGES_DIR / image)
    tasks = label_studio_tasks(ids, image_urls(dest / IMAGES_DIR, image_url, document_root))
    save_json(staging / TASKS_FILE, tasks)
    (staging / LABEL_CONFIG_FILE).write_text(label_studio_config(prompts))
    publish(staging, dest)
    return tasks


def _keep(paths, sampled, *, keep_answers: bool) -> None:
    """The sample becomes the project's: a new one in place of an earlier one, its answers and
    the Label Studio project it was pushed to; or (`keep_answers`) the same one with frames
    added."""
    from dataminer_dagster.assets.filter.calibration_review import (
        ANSWERS_FILE,
        SAMPLE_FILE,
        save_json,
    )

    paths.calibration_dir.mkdir(parents=True, exist_ok=True)
    if not keep_answers:
        (paths.calibration_dir / ANSWERS_FILE).unlink(missing_ok=True)
        (paths.calibration_dir / LABEL_STUDIO_FILE).unlink(missing_ok=True)
    save_json(paths.calibration_dir / SAMPLE_FILE, sampled.to_json())


def _check_more(more: bool, precision: float | None) -> None:
    if precision is not None and not more:
        raise UserError("--precision aims the frames that --more adds: give it with --more")


def _drawn_line(name: str, drawn: _Drawn, count: int, into: str, precision: float | None) -> str:
    """What was drawn for review and where it went (`into`)."""
    sampled, aim = drawn.sampled, drawn.aim
    more = " more" if drawn.more else ""
    head = f"{count}{more} of the {sampled.population} frames of project {name} {into}"
    if not drawn.more:
        return f"{head}, from {len(sampled.strata)} strata of best prompt and score"
    if aim is None:
        where = "spread over the strata (no threshold recommended yet)"
    elif aim.recommended:
        goal = "best F1" if precision is None else f"precision >= {precision:g}"
        where = f"where they narrow the estimate at {_decimal(aim.threshold)} ({goal} so far)"
    else:
        where = (
            f"where they narrow the estimate at {_decimal(aim.threshold)} (no threshold reaches "
            f"precision {precision:g} so far; there it comes nearest)"
        )
    return f"{head}, {where}; the sample has {len(sampled.ids)} frames now, its answers kept"


@calibrate.command("export")
@click.argument("name")
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
@option_group(*_sample_options, *_more_options)
@image_options("DEST/images/")
def export(
    name: str,
    dest: Path,
    frames: int,
    seed: int,
    more: bool,
    precision: float | None,
    image_url: str | None,
    document_root: Path | None,
) -> None:
    """Draw a sample of project NAME's frames for a yes/no review and write it into folder DEST:
    images/ (the frames), tasks.json (Label Studio tasks) and labeling.xml (their labelling
    interface). The sample takes frames from every part of each positive prompt's score range
    (strata by best prompt and score); a new sample replaces the project's earlier one and its
    answers, unless --more adds to it."""
    dest = dest.expanduser().resolve()
    if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
        raise UserError(f"{dest} already exists and is not an empty folder; choose a new one")
    _check_more(more, precision)
    drawn = _draw_more(name, frames, seed, precision) if more else _draw_new(name, frames, seed)
    _write_for_review(drawn.sampled.prompts, drawn.ids, drawn.files, dest, image_url, document_root)
    _keep(drawn.paths, drawn.sampled, keep_answers=more)
    click.echo(_drawn_line(name, drawn, len(drawn.ids), f"in {dest}", precision) + ":")
    click.echo(f"  {TASKS_FILE}: Label Studio tasks (import them into a project whose labelling")
    click.echo(f"    interface is {LABEL_CONFIG_FILE}: answer each frame yes or no)")
    click.echo(f"  {IMAGES_DIR}/: the frames; for CVAT, a task of them with the labels yes and no,")
    click.echo("    each frame answered with one tag, exported as 'CVAT for images 1.1'")
    click.echo(f"the answers come back with `dataminer calibrate import {name} EXPORT`")


@calibrate.command("push")
@click.argument("name")
@option_group(*_sample_options, *_more_options)
@server_options
@image_options("the project's calibration/review/images/ (review-N/images/ with --more)")
@click.option("--title", help="The Label Studio project's title [default: calibrate NAME].")
def push(
    name: str,
    frames: int,
    seed: int,
    more: bool,
    precision: float | None,
    url: str | None,
    token: str | None,
    image_url: str | None,
    document_root: Path | None,
    title: str | None,
) -> None:
    """Draw a sample of project NAME's frames, as `export` does into the project's
    calibration/review/ folder, and send it to a running Label Studio as a new project for a
    yes/no review. With --more, the frames added go into review-N/ (N: the sample's frames with
    them) and into the Label Studio project the sample was pushed to (a new one if it was
    exported). Without --image-url, Label Studio serves the images itself
    (LOCAL_FILES_SERVING_ENABLED=true and LOCAL_FILES_DOCUMENT_ROOT, given as --document-root)."""
    import shutil

    from dataminer_dagster.assets.dataset.label_studio import LabelStudioError
    from dataminer_dagster.assets.filter.calibration_review import label_studio_config, save_json

    _check_more(more, precision)
    drawn = _draw_more(name, frames, seed, precision) if more else _draw_new(name, frames, seed)
    calibration_dir = drawn.paths.calibration_dir
    known = _pushed(drawn.paths) if more else None
    client = label_studio(url or (known or {}).get("url"), token)
    review = REVIEW_DIR + (f"-{len(drawn.sampled.ids)}" if more else "")
    folder = calibration_dir / review
    shutil.rmtree(folder, ignore_errors=True)
    tasks = _write_for_review(
        drawn.sampled.prompts, drawn.ids, drawn.files, folder, image_url, document_root
    )
    try:
        if known:
            project_id = known["project"]
        else:
            project_id = client.create_project(
                title or f"calibrate {name}", label_studio_config(drawn.sampled.prompts)
            )
        if not image_url:
            client.connect_local_files(project_id, str(folder / IMAGES_DIR), f"{name} {review}")
        taken = client.import_tasks(project_id, tasks)
    except LabelStudioError as error:
        raise UserError(str(error)) from None
    if not more:  # the folders of an earlier sample's frames
        for earlier in calibration_dir.glob(f"{REVIEW_DIR}-*"):
            shutil.rmtree(earlier, ignore_errors=True)
    _keep(drawn.paths, drawn.sampled, keep_answers=more)
    save_json(calibration_dir / LABEL_STUDIO_FILE, {"url": client.url, "project": project_id})
    into = f"in Label Studio ({client.url}/projects/{project_id})"
    click.echo(_drawn_line(name, drawn, taken, into, precision))
    click.echo(f"when answered: dataminer calibrate pull {name}")


def _pushed(paths) -> dict | None:
    """The Label Studio project (url and id) that `calibrate push` sent the project's current
    sample to, if it did."""
    import json

    pushed = paths.calibration_dir / LABEL_STUDIO_FILE
    return json.loads(pushed.read_text()) if pushed.is_file() else None


_report_options = option_group(
    click.option(
        "--precision",
        type=click.FloatRange(0, 1, min_open=True),
        help="Recommend the lowest threshold whose estimated precision reaches this "
        "(the most recall at that precision) [default: the threshold of the best F1].",
    ),
    click.option(
        "--apply",
        is_flag=True,
        help="Write the recommended threshold to the project's config: its frames are "
        "filtered again from the embedding cache, and what follows is made again.",
    ),
    click.option(
        "--wait/--no-wait",
        default=True,
        show_default=True,
        help="With --apply: run the project now, in this process (--no-wait: queue it "
        "for the sensors or the next `dataminer run`).",
    ),
    click.option("--timeout", type=float, help="Give up waiting after this many seconds."),
)


@calibrate.command("import")
@click.argument("name")
@click.argument("export", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_report_options
def import_command(
    name: str,
    export: Path,
    precision: float | None,
    apply: bool,
    wait: bool,
    timeout: float | None,
) -> None:
    """Bring the yes/no answers on project NAME's calibration sample back from EXPORT (Label
    Studio's JSON export, or CVAT's 'CVAT for images 1.1' XML export), keep them, and report
    precision and recall per threshold. Answers of a later import replace those of an earlier
    one frame by frame."""
    catalog, project, paths = _project(name)
    _import(catalog, project, paths, export, precision, apply, wait, timeout)


def _import(catalog, project, paths, export: Path, precision, apply, wait, timeout) -> None:
    from dataminer_dagster.assets.filter.calibration_review import (
        ANSWERS_FILE,
        CalibrationImportError,
        check_fits,
        load_answers,
        read_answers,
        save_json,
    )

    sample = _sample(project, paths)
    try:
        kind, said = read_answers(export)
        check_fits(said, sample)
    except CalibrationImportError as error:
        raise UserError(f"project {project.name}: {error}; nothing was imported") from None
    answers = {**load_answers(paths.calibration_dir), **said}
    save_json(paths.calibration_dir / ANSWERS_FILE, answers)
    yes = sum(said.values())
    click.echo(
        f"imported {len(said)} answers ({kind}): {yes} yes, {len(said) - yes} no; "
        f"{len(answers)} of the sample's {len(sample.ids)} frames are answered"
    )
    _report(catalog, project, paths, sample, answers, precision, apply, wait, timeout)


@calibrate.command("pull")
@click.argument("name")
@server_options
@_report_options
def pull(
    name: str,
    url: str | None,
    token: str | None,
    precision: float | None,
    apply: bool,
    wait: bool,
    timeout: float | None,
) -> None:
    """Bring the answers of the Label Studio project that `calibrate push` made for project NAME
    back, as `import` does with an export file (kept in the project's calibration/ folder)."""
    from dataminer_dagster.assets.dataset.label_studio import LabelStudioError
    from dataminer_dagster.assets.filter.calibration_review import save_json

    catalog, project, paths = _project(name)
    known = _pushed(paths)
    if known is None:
        raise UserError(
            f"no Label Studio project known for {name}'s calibration sample: `dataminer "
            f"calibrate push {name}` first"
        )
    try:
        answers = label_studio(url or known["url"], token).export_answers(known["project"])
    except LabelStudioError as error:
        raise UserError(str(error)) from None
    export = paths.calibration_dir / f"label-studio-{known['project']}.json"
    save_json(export, answers)
    _import(catalog, project, paths, export, precision, apply, wait, timeout)


@calibrate.command("show")
@click.argument("name")
@_report_options
def show(
    name: str, precision: float | None, apply: bool, wait: bool, timeout: float | None
) -> None:
    """Report precision and recall per threshold of project NAME from the answers imported, and
    the threshold recommended; with --apply, write it to the project's config."""
    from dataminer_dagster.assets.filter.calibration_review import load_answers

    catalog, project, paths = _project(name)
    sample = _sample(project, paths)
    answers = load_answers(paths.calibration_dir)
    if not answers:
        raise UserError(
            f"no answers on project {name}'s calibration sample yet: review it and bring the "
            f"export back with `dataminer calibrate import {name} EXPORT`"
        )
    _report(catalog, project, paths, sample, answers, precision, apply, wait, timeout)


def _sample(project, paths):
    import json

    from dataminer_dagster.assets.filter.calibration_review import load_sample, rule_of

    try:
        sample = load_sample(paths.calibration_dir)
    except ValueError as error:  # drawn by an earlier version of dataminer
        raise UserError(
            f"project {project.name}'s calibration sample in {paths.calibration_dir} is {error}: "
            f"`dataminer calibrate export {project.name} DEST`"
        ) from None
    if sample is None:
        raise UserError(
            f"project {project.name} has no calibration sample: draw one with "
            f"`dataminer calibrate export {project.name} DEST`"
        )
    config = project.config.filter
    drawn = (sample.model, sample.prompts, json.dumps(sample.rule, sort_keys=True))
    if drawn != (
        config.model,
        tuple(config.positive_prompts),
        json.dumps(rule_of(config), sort_keys=True),
    ):
        raise UserError(
            f"project {project.name}'s calibration sample was drawn for other prompts, another "
            "model or other negative and junk thresholds than its config has now: once the "
            f"project is filtered with them, draw a new one (`dataminer calibrate export "
            f"{project.name} DEST`)"
        )
    return sample


def _report(catalog, project, paths, sample, answers, precision, apply, wait, timeout) -> None:
    from dataminer_dagster.assets.filter.calibration import choose_threshold

    answered = sample.answers(answers)
    if not len(answered.yes):
        raise UserError(f"none of the answers is about project {project.name}'s current sample")
    choice = choose_threshold(answered, precision)
    chosen = choice.estimate.threshold if choice.estimate else None
    _print_estimates(project, sample, answered, chosen, choice.goal)
    if chosen is None:
        raise UserError(
            "no threshold keeps a frame answered yes"
            if precision is None
            else f"no threshold reaches {choice.goal} on these answers: ask for less, or review "
            f"more frames (`{_more_command(project.name, paths, precision)}`)"
        )
    current = project.config.filter.positive_threshold
    click.echo(
        f"recommended positive_threshold: {_decimal(chosen)} ({choice.goal}; the config has "
        f"{_decimal(current)})"
    )
    if not apply:
        click.echo(
            f"  `dataminer calibrate show {project.name}{_asked(precision)} --apply` writes it to "
            "the config;"
        )
        click.echo(
            f"  `{_more_command(project.name, paths, precision)}` adds frames to review where "
            "they narrow its estimate most"
        )
        return
    _apply(catalog, project, chosen, wait, timeout)


def _more_command(name: str, paths, precision: float | None) -> str:
    """The command that adds frames to project NAME's sample the way it went out for review."""
    how = f"push {name}" if _pushed(paths) else f"export {name} DEST"
    return f"dataminer calibrate {how} --more{_asked(precision)}"


def _asked(precision: float | None) -> str:
    """The precision asked for, as an option of the commands the report names."""
    return f" --precision {precision:g}" if precision is not None else ""


def _print_estimates(project, sample, answered, chosen: float | None, goal: str) -> None:
    """The table of thresholds (the config's and the chosen one marked), then each prompt's
    figures at the chosen one."""
    from dataminer_dagster.assets.filter.calibration import estimate, report_thresholds
    from dataminer_dagster.assets.filter.calibration_review import table_lines

    current = project.config.filter.positive_threshold
    marks = {current: "<- the config's"}
    if chosen is not None:
        marks[chosen] = f"<- recommended ({goal})" + (
            " and the config's" if chosen == current else ""
        )
    n_yes = int(answered.yes.sum())
    click.echo(
        f"precision and recall of project {project.name}'s filter by positive_threshold, from "
        f"{len(answered.yes)} answers ({n_yes} yes, {len(answered.yes) - n_yes} no)"
    )
    click.echo(
        f"  estimates for all {sample.population} frames of the project: the frames a threshold "
        f"keeps are counted in each of {len(sample.strata)} strata of best prompt and score, "
        "their share of yes estimated from the stratum's answers; 95 % Wilson intervals (for "
        "precision widened by the kept frames of strata where none of them was answered)"
    )
    if answered.uncovered:
        click.echo(
            f"  {answered.uncovered} frames are in strata without an answer: no estimate covers "
            "them"
        )
    rows = report_thresholds(answered, TABLE_ROWS, list(marks))
    for line in table_lines([estimate(answered, t) for t in rows], sample.kept, marks):
        click.echo(line)
    if len(sample.prompts) < 2 or chosen is None:
        return
    click.echo(f"per best positive prompt, at {_decimal(chosen)}:")
    for index, prompt in enumerate(sample.prompts):
        mine = answered.of_prompt(index)
        if len(mine.yes):
            e = estimate(mine, chosen)
            click.echo(
                f"  {prompt!r}: precision {_figure(e.precision, e.precision_interval)}, "
                f"recall {_figure(e.recall, e.recall_interval)} ({len(mine.yes)} answers)"
            )


def _decimal(value: float) -> str:
    """A threshold as YAML reads it back as a number (0.00001, not 1e-05), with the fewest
    digits that give the same float32, the precision the filter rule compares in."""
    import numpy as np

    return np.format_float_positional(np.float32(value), unique=True, trim="-")


def _figure(value: float, interval: tuple[float, float]) -> str:
    return "-" if math.isnan(value) else f"{value:.2f} [{interval[0]:.2f}-{interval[1]:.2f}]"


def _apply(catalog, project, threshold: float, wait: bool, timeout: float | None) -> None:
    """Register the project's config with `threshold`: the filter runs again from the embedding
    cache, as after any change of its thresholds."""
    from dataminer_dagster.cli.registration import registration_lines
    from dataminer_dagster.config import ConfigError, parse_project_config
    from dataminer_dagster.settings import load_settings

    raw = project.config.to_json()
    raw["filter"]["positive_threshold"] = threshold
    try:
        config = parse_project_config(raw, source=f"project {project.name}")
        result = catalog.projects.register(config, protected=load_settings().protected_dirs)
    except ConfigError as error:
        raise UserError(str(error)) from None
    for line in registration_lines(result):
        click.echo(line)
    click.echo(
        f"  set positive_threshold: {_decimal(threshold)} in the project's YAML file too: a later "
        "`dataminer run` or `project add` of the file registers what it says"
    )
    if not wait:
        return
    from dataminer_dagster.cli.running import run_projects

    raise SystemExit(run_projects([config], timeout=timeout, progress=False))
