"""Schema migrations (Alembic) for the claim tables, run against a live connection."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa


def migrations_dir() -> Path:
    """`migrations/` beside the package in a checkout, or the copy packed into the wheel."""
    package_root = Path(__file__).resolve().parents[1]
    for candidate in (package_root / "_migrations", package_root.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError(f"No Alembic migrations found near {package_root}")


def _alembic_config(connection: sa.Connection):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    return config


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; a no-op when it is already there. Safe to run concurrently."""
    from alembic import command

    with engine.connect() as connection:
        command.upgrade(_alembic_config(connection), revision)


_migrated: set[str] = set()


def ensure_schema(engine: sa.Engine) -> None:
    """Migrate once per process and database (cheap when already at head)."""
    key = engine.url.render_as_string(hide_password=False)
    if key not in _migrated:
        upgrade(engine)
        _migrated.add(key)


def current_revision(engine: sa.Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from dataminer_dagster.db.schema import SCHEMA

    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"version_table_schema": SCHEMA})
        return context.get_current_revision()
