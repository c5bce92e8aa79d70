"""Alembic environment for the claim tables (schema `dataminer`).

Run through `dataminer db upgrade` (dataminer_dagster/db/migrate.py), which hands over a live
connection; the version table lives in the `dataminer` schema, apart from Dagster's own.
"""

from alembic import context
from sqlalchemy import text

from dataminer_dagster.db.schema import SCHEMA, metadata

# Any constant works; it only has to be the same in every process that migrates.
MIGRATION_LOCK_ID = 0x6461746D696E6572

connection = context.config.attributes["connection"]
connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
try:
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    connection.commit()
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
finally:
    connection.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID})
    connection.commit()
