"""row_counts: how many rows the catalog's partition tables hold, kept as deltas.

The work sensor compares, on a quiet tick at most every 30 s, the number of rows of projects,
videos and project_videos with the number of partitions Dagster has of each (to find rows its
cursor passed, engine/planning.py). A count(*) read every row: 0.3-0.6 s a comparison at
1,000,000 videos. Triggers now add, per statement that inserts or deletes rows of these tables,
one row with the change of the count, in the statement's transaction; a count is the sum of its
table's deltas, which the reader folds into one row now and then (db/partition_rows.py). Appending
instead of updating one counter row keeps concurrent catalog runs from waiting for each other.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_S = "dataminer"
_TABLES = ("projects", "videos", "project_videos")


def upgrade() -> None:
    op.create_table(
        "row_counts",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("table_name", sa.Text, nullable=False),
        sa.Column("delta", sa.BigInteger, nullable=False),
        schema=_S,
    )
    op.create_index("row_counts_table", "row_counts", ["table_name", "id"], schema=_S)
    op.execute(f"""
        CREATE FUNCTION {_S}.count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {_S}.row_counts (table_name, delta)
            SELECT TG_TABLE_NAME, CASE WHEN TG_OP = 'DELETE' THEN -count(*) ELSE count(*) END
              FROM changed HAVING count(*) > 0;
            RETURN NULL;
        END $$""")
    for table in _TABLES:
        for event, transition in (("INSERT", "NEW"), ("DELETE", "OLD")):
            op.execute(f"""
                CREATE TRIGGER {table}_{event.lower()}_counts_rows
                 AFTER {event} ON {_S}.{table} REFERENCING {transition} TABLE AS changed
                 FOR EACH STATEMENT EXECUTE FUNCTION {_S}.count_rows()""")
        op.execute(
            f"INSERT INTO {_S}.row_counts (table_name, delta)"
            f" SELECT '{table}', count(*) FROM {_S}.{table}"
        )


def downgrade() -> None:
    for table in _TABLES:
        for event in ("INSERT", "DELETE"):
            op.execute(f"DROP TRIGGER {table}_{event.lower()}_counts_rows ON {_S}.{table}")
    op.execute(f"DROP FUNCTION {_S}.count_rows()")
    op.drop_table("row_counts", schema=_S)
