"""`dataminer db`: the claim-table database (schema, embedded server, URL, reset)."""

from __future__ import annotations

import click

from dataminer_dagster.cli.app import UserError, context, main


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

    settings = load_settings()
    url = claims_database_url(settings)
    engine = get_engine(url, lease=settings.lease)
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
    how = stop_embedded(settings)
    click.echo(f"embedded PostgreSQL at {settings.embedded_pgdata} {how or 'was not running'}")


@db.command("url")
def db_url() -> None:
    """Print the database URL in use (password and secret query values masked)."""
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.settings import load_settings

    click.echo(redact_url(claims_database_url(load_settings())))


@db.command("reset")
@click.option("--yes", is_flag=True, help="Required: confirms that everything is to be dropped.")
def db_reset(yes: bool) -> None:
    """Drop the claim tables (schema `dataminer`) with every project, video and work item, and
    create them again, empty. Files on disk and Dagster's run history are not touched. Refuses
    without --yes."""
    from dataminer_dagster.core.redact import redact_url
    from dataminer_dagster.db import deletions

    _, store, _ = context()
    url = redact_url(store.engine.url.render_as_string(hide_password=False))
    before = deletions.database_summary(store.engine)
    if not yes:
        raise UserError(
            f"this drops {before.projects} projects, {before.videos} videos and "
            f"{before.work_items} work items in {url}; run again with --yes to do it"
        )
    if before.running:
        click.echo(
            f"warning: {before.running} work items are running; their runs will fail", err=True
        )
    deletions.reset_schema(store.engine)
    click.echo(
        f"{url}: dropped {before.projects} projects, {before.videos} videos and "
        f"{before.work_items} work items; the schema is empty and at the latest revision"
    )
