"""Counts kept as deltas: a trigger appends, per statement that inserts or deletes rows, one row
with the change of the count, in the statement's transaction; a count is the sum of its deltas,
which a reader folds into one row now and then. Appending instead of updating one counter row
keeps concurrent writers from waiting for each other, and reading a count costs its few deltas,
not a count(*) of the rows, which grows with the catalog.

Two such counters: the catalog's rows of each partition set (`row_counts`, migration
0012) and Dagster's partitions of each set (hosting/instance_storage.py).
"""

from __future__ import annotations

import sqlalchemy as sa

# Past this many deltas of one count, a reader folds them into one.
FOLD_COUNTS_PAST = 1000


def read_count(conn: sa.Connection, table: str, column: str, key: str) -> int:
    """The count of `key`: the sum of the deltas of `table` whose `column` is `key`."""
    total, deltas = conn.execute(
        sa.text(f"SELECT coalesce(sum(delta), 0), count(*) FROM {table} WHERE {column} = :key"),
        {"key": key},
    ).one()
    if deltas > FOLD_COUNTS_PAST:
        _fold(conn, table, column, key)
    return int(total)


def _fold(conn: sa.Connection, table: str, column: str, key: str) -> None:
    """The key's deltas folded into one row, in a transaction of its own. A delta committed
    meanwhile is not seen by the delete, so it stays; two folds at once delete each row once."""
    with conn.engine.begin() as fold:
        fold.execute(
            sa.text(f"""WITH gone AS (DELETE FROM {table} WHERE {column} = :key RETURNING delta)
                        INSERT INTO {table} ({column}, delta)
                        SELECT :key, sum(delta) FROM gone HAVING count(*) > 0"""),
            {"key": key},
        )
