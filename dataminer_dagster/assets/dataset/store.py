"""The dataset stage's SQL: dataset version numbers, allocated in the database.

A new version's number is one more than the last one the project was given (table
`dataset_version_numbers`) and than any its versions folder holds (versions kept before the
database counted them, or by a database made afresh for old files). The project's row is locked
while the number is chosen, so two builds of one project (a run whose lease was taken and the run
that took it, on one machine or two) never get the same number. A number whose build is never
published (it failed, or lost its lease) is not given again: version numbers only grow, and may
skip.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.assets.dataset.dataset_versions import list_versions
from dataminer_dagster.db.schema import SCHEMA

S = SCHEMA


def allocate_version_number(conn: sa.Connection, project_id: int, versions_dir: Path) -> int:
    """A dataset version number no other build of the project has been or will be given. Call it
    in a transaction of its own: the project's counter stays locked until that ends."""
    conn.execute(
        sa.text(f"""
            INSERT INTO {S}.dataset_version_numbers (project_id, last_number)
            VALUES (:p, 0) ON CONFLICT (project_id) DO NOTHING
        """),
        {"p": project_id},
    )
    last = conn.execute(
        sa.text(f"""
            SELECT last_number FROM {S}.dataset_version_numbers WHERE project_id = :p FOR UPDATE
        """),
        {"p": project_id},
    ).scalar_one()
    kept = max((v.number for v in list_versions(versions_dir)), default=0)  # under the lock
    number = max(last, kept) + 1
    conn.execute(
        sa.text(f"UPDATE {S}.dataset_version_numbers SET last_number = :n WHERE project_id = :p"),
        {"p": project_id, "n": number},
    )
    return number
