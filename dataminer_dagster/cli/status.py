"""`dataminer status` and `dataminer project status`: printing where the projects are (the data comes from db/reports.py)."""

from __future__ import annotations

import click

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.cli.app import context, main, project_or_fail
from dataminer_dagster.cli.projects import project
from dataminer_dagster.db.schema import BLOCKED, DEAD, FAILED, FINISHED
from dataminer_dagster.settings import UiPolicy


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
    if data["target"]:
        _print_target(data["target"])
    if data["refresh"] or data["sources"]:
        _print_sources(data["refresh"], data["sources"])
    if data["yield"]:
        _print_yield(data["yield"])
    if data["stale"]:
        click.echo("")
        click.echo(
            "stale (done with an earlier config; they run again): "
            + ", ".join(f"{stage} {n}" for stage, n in data["stale"].items())
        )
    frames = data["frames"]
    click.echo("")
    click.echo(
        f"frames: {frames['extracted']} extracted, {frames['passed_filter']} passed the filter, "
        f"{frames['kept_after_dedup']} kept after dedup, {frames['in_dataset']} in the dataset"
    )
    if data["copies"]:
        click.echo("")
        click.echo("copies (the same content as another video: processed once, as that video):")
        for c in data["copies"]:
            click.echo(
                f"  {c['video']} ({c['source']}) is a copy of {c['same_as']} ({c['original_source']})"
            )
    if data["long_running"]:
        click.echo("")
        click.echo("long-running (held far longer than their stage usually takes):")
        for held in data["long_running"]:
            click.echo(f"  {held['message']}")
            click.echo(f"    {held['ui']}")
    if data["failures"]:
        click.echo("")
        click.echo("latest failures:")
        for f in data["failures"]:
            click.echo(
                f"  {f['at']}  {f['stage']} {f['item']}: {f['status']} "
                f"({f['attempts']} attempts): {f['error']}"
            )
            click.echo(f"    {f['ui']}")


def _print_sources(refresh: dict | None, sources: list[dict]) -> None:
    click.echo("")
    if refresh:
        click.echo(
            f"refresh: cron {refresh['cron']!r} ({refresh['timezone']}), last listed "
            f"{refresh['last_listed_at'] or 'never'}, next {refresh['next_at'] or 'after the first listing'}"
        )
    for s in sources:
        if s["failures"]:
            click.echo(
                f"  {s['source']}: FAILING ({s['failures']} times in a row): {s['error']}; "
                f"asked again after {s['retry_at']}"
            )
        else:
            click.echo(
                f"  {s['source']}: {s['videos_listed']} videos listed, {s['videos_new']} new "
                f"(listed {s['listed_at']})"
            )


def _print_target(t: dict) -> None:
    click.echo("")
    click.echo(
        f"target: {t['dataset_images']} of {t['images']} images; {t['state']} "
        f"(round {t['round']}{': ' + t['reason'] if t['reason'] else ''})"
    )
    budget = ", ".join(f"{k} {v:g}" for k, v in t["budget"].items() if v is not None)
    click.echo(
        f"spent: {t['videos']} videos linked, {t['downloaded']} downloaded, "
        f"{t['download_hours']:.2f} h, {t['download_gb']:.2f} GB"
        + (f" (budget: {budget})" if budget else "")
    )


def _print_yield(rows: list[dict]) -> None:
    click.echo("")
    click.echo(
        f"{'yield per source':<44}{'videos':>7}{'fetched':>8}{'minutes':>9}{'frames':>8}"
        f"{'passed':>8}{'kept':>7}{'kept/video':>11}{'kept/min':>9}"
    )
    for y in rows:
        per_video, per_minute = (
            "-" if y[k] is None else f"{y[k]:.1f}" for k in ("kept_per_video", "kept_per_minute")
        )
        name = y["source"] if len(y["source"]) <= 43 else y["source"][:40] + "..."
        click.echo(
            f"{name:<44}{y['videos']:>7}{y['downloaded']:>8}{y['downloaded_minutes']:>9.1f}"
            f"{y['frames_extracted']:>8}{y['frames_passed']:>8}{y['frames_kept']:>7}"
            f"{per_video:>11}{per_minute:>9}"
        )


def _print_overview(projects: list[dict]) -> None:

    if not projects:
        click.echo("no projects yet: dataminer project add CONFIG")
        return
    click.echo(
        f"{'project':<24} {'stage':<9} {'videos':>6}"
        + "".join(f" {s:>10}" for s in REGISTRY.member_board)
        + f" {'failed':>7} {'dead':>6} {'blocked':>7}"
    )
    for p in projects:
        stages = p["stages"]
        progress = ""
        for stage in REGISTRY.member_board:
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

    from dataminer_dagster.db.host_pauses import active_pauses
    from dataminer_dagster.db.reports import overview, project_status
    from dataminer_dagster.settings import load_settings

    _, _, catalog = context()
    paused = active_pauses(catalog.engine)
    if project_name is None:
        projects = overview(catalog)
        if as_json:
            data = {"projects": projects, "host_pauses": [p.to_json() for p in paused]}
            click.echo(json.dumps(data, indent=2))
        else:
            _print_overview(projects)
            _print_host_pauses(paused)
        return
    settings = load_settings()
    data = project_status(
        catalog, project_or_fail(catalog, project_name), window, settings.long_running
    )
    _link_items(data, settings.ui)
    if data["refresh"]:
        from datetime import datetime

        from dataminer_dagster.engine.refresh_schedule import next_refresh

        refresh, last = data["refresh"], data["refresh"]["last_listed_at"]
        after = next_refresh(
            refresh["cron"], refresh["timezone"], last and datetime.fromisoformat(last)
        )
        refresh["next_at"] = after and after.isoformat(timespec="seconds")
    if as_json:
        click.echo(json.dumps({**data, "host_pauses": [p.to_json() for p in paused]}, indent=2))
    else:
        _print_project_status(data)
        _print_host_pauses(paused)


def _link_items(data: dict, ui: UiPolicy) -> None:
    """Each failed and long-running item with the UI's page of its partition: item keys are
    their stage's partition keys (registry.py)."""
    from dataminer_dagster.core.ui_links import partition_link

    prefix = [ui.asset_prefix] if ui.asset_prefix else []
    for item in [*data["failures"], *data["long_running"]]:
        asset = REGISTRY[item["stage"]].asset
        item["ui"] = partition_link(ui.url, [*prefix, asset], item["item"])


def _print_host_pauses(paused) -> None:
    """Hosts that said stop: no run sends them a request before the time shown."""
    if paused:
        click.echo("")
        click.echo("paused hosts (no run sends them a request before then):")
        for pause in paused:
            click.echo(f"  {pause.describe()}")


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
    only), the items a config change made stale, frames kept at each stage, the videos that are copies of another (the same content,
    processed once), and the latest failures with their reasons; each failed or long-running
    item with the link to its partition in the Dagster UI (settings: ui.url, ui.asset_prefix).
    """
    _show_status(project_name, as_json, window)


@project.command("status")
@click.argument("name")
@_status_options
def project_status(name: str, as_json: bool, window: float) -> None:
    """The same as `dataminer status NAME`: work items, throughput and ETA per stage, frames,
    latest failures."""
    _show_status(name, as_json, window)
