"""Alembic environment for the claim tables (schema `dataminer`).

Run only through dataminer_dagster/db/migrate.py, which hands over a connection inside a
transaction that already holds the migration lock; everything here happens in that transaction
and is committed (or rolled back) by the caller. The version table lives in the `dataminer`
schema, apart from Dagster's own.
"""

from alembic import context
from sqlalchemy import text

from dataminer_dagster.db.schema import SCHEMA, metadata

connection = context.config.attributes["connection"]
connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table_schema=SCHEMA,
    include_schemas=True,
)
with context.begin_transaction():
    context.run_migrations()
