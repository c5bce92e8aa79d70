"""What registering a project's config did, in words: `dataminer project add` prints it, and
`dataminer run CONFIG` prints it before it drives the project."""

from __future__ import annotations


def registration_lines(result) -> list[str]:
    """What registering a project's config did (a `RegisterResult`), in words."""
    name = result.project.name
    verb = "registered" if result.created else ("updated" if result.changed else "unchanged")
    lines = [f"project {name} {verb}; output in {result.project.output_dir}"]
    if result.moved_from is not None:
        lines.append(f"its results moved there from {result.moved_from}")
    if result.created:
        lines.append(
            "its video catalog is queued (the discovery sensor, `dataminer run` or "
            "`dataminer populate` runs it)"
        )
    elif result.changed_keys:
        lines.append(f"changed: {', '.join(result.changed_keys)}")
        lines.append(
            f"runs again: {', '.join(result.stale_stages)} (dataminer status {name} counts it)"
            if result.stale_stages
            else "nothing done is redone: these keys change how work runs, or the work still to come"
        )
    refresh = result.project.config.inputs.refresh
    if refresh is not None and (
        result.created or any(k.startswith("inputs.refresh") for k in result.changed_keys)
    ):
        from dataminer_dagster.sensors.refresh_schedules import schedule_name

        lines.append(
            f"its sources are listed again at '{refresh.cron}' ({refresh.timezone}) by its "
            f"{schedule_name('', name)} schedule once the code location loads again (`dataminer "
            "services` reloads it every minute; `dg dev` and the UI: Reload definitions); the "
            "refresh_sources sensor keeps that cron until then"
        )
    return lines
