"""The `dataminer` group, and what every command module shares: errors a user can fix, this
process's database context, loading a project config."""

from __future__ import annotations

from pathlib import Path

import click

from dataminer_dagster.acquisition.errors import HostPaused
from dataminer_dagster.config import ConfigError, load_project_config
from dataminer_dagster.db.embedded_host import EmbeddedServerInUse
from dataminer_dagster.db.project_records import ProjectBusyError
from dataminer_dagster.paths import UnsafePathError
from dataminer_dagster.settings import SettingsError


class UserError(click.ClickException):
    """An error the user can fix; printed without a traceback."""


class Commands(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        # Settings read, the embedded server's host, a project registered, a host that asked us
        # to wait.
        except (
            SettingsError,
            EmbeddedServerInUse,
            UnsafePathError,
            ProjectBusyError,
            HostPaused,
        ) as exc:
            raise UserError(str(exc)) from None


def context():
    """Settings, engine, lease store and catalog for this process (migrating the schema first)."""
    from dataminer_dagster.db import migrate
    from dataminer_dagster.db.catalog import Catalog
    from dataminer_dagster.db.engine import get_engine
    from dataminer_dagster.db.leases import LeaseStore
    from dataminer_dagster.db.served_data import DataDirectoryMismatch, require_served_data_dir
    from dataminer_dagster.db.server import claims_database_url
    from dataminer_dagster.paths import DataPaths
    from dataminer_dagster.settings import load_settings

    settings = load_settings()
    engine = get_engine(claims_database_url(settings), lease=settings.lease)
    migrate.ensure_schema(engine)
    try:
        require_served_data_dir(engine, settings.data_dir)
    except DataDirectoryMismatch as mismatch:
        raise UserError(str(mismatch)) from None
    store = LeaseStore(engine, settings.retry)
    return settings, store, Catalog(engine, store, DataPaths(settings.data_dir))


def load_config(path: str):
    try:
        return load_project_config(Path(path))
    except ConfigError as exc:
        raise UserError(str(exc)) from None


@click.group(cls=Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dataminer-dagster")
def main() -> None:
    """Mine computer-vision datasets from video, as a Dagster asset graph.

    State lives in PostgreSQL: $DATAMINER_DATABASE_URL, or an embedded server under
    $DATAMINER_HOME (default ./.dataminer). Media go to $DATAMINER_DATA_DIR
    (default $DATAMINER_HOME/data).
    """


def project_or_fail(catalog, name: str):
    project = catalog.projects.get(name)
    if project is None:
        raise UserError(f"no project named {name!r} (dataminer project list)")
    return project
