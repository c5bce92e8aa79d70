"""The dataset stage's SQL: dataset version numbers, allocated in the database.

A new version's number is one more than the last one the project was given (table
`dataset_version_numbers`) and than any its versions folder holds (versions kept before the
database counted them, or by a database made afresh for old files). The project's row is locked
while the number is chosen, so two builds of one project (a run whose lease was taken and the run
that took it, on one machine or two) never get the same number.

A number given out is held by the lease token of its build (table `dataset_version_holders`) until
that build's commit publishes its folder (`version_published`). A number whose build's lease is
dead (the build failed, or lost its lease) and whose folder was never published is given again
before a new one, so that a build retried after a failure keeps its first attempt's number and the
numbers stay dense. A dead holder cannot publish (a publish is part of the commit that checks the
lease token), so one number never names two published versions.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.assets.dataset.dataset_versions import list_versions, version_folder
from dataminer_dagster.db.file_changes import live_tokens
from dataminer_dagster.db.schema import SCHEMA

S = SCHEMA


def allocate_version_number(
    conn: sa.Connection, project_id: int, versions_dir: Path, token: uuid.UUID
) -> int:
    """A dataset version number for the build under lease `token`: one no live build holds and
    no published version has. Call it in a transaction of its own: the project's counter stays
    locked until that ends."""
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
    number = _given_up_number(conn, project_id, versions_dir, token)
    if number is None:
        kept = max((v.number for v in list_versions(versions_dir)), default=0)  # under the lock
        number = max(last, kept) + 1
        conn.execute(
            sa.text(
                f"UPDATE {S}.dataset_version_numbers SET last_number = :n WHERE project_id = :p"
            ),
            {"p": project_id, "n": number},
        )
    conn.execute(
        sa.text(f"""
            INSERT INTO {S}.dataset_version_holders (project_id, number, lease_token)
            VALUES (:p, :n, :t)
            ON CONFLICT (project_id, number) DO UPDATE SET lease_token = EXCLUDED.lease_token
        """),
        {"p": project_id, "n": number, "t": token},
    )
    return number


def _given_up_number(
    conn: sa.Connection, project_id: int, versions_dir: Path, token: uuid.UUID
) -> int | None:
    """The lowest number given to a build that can no longer publish it (its lease is dead) and
    never published (no folder), or already given to `token`; None when there is none. Holders
    whose folder is there were published: they are forgotten."""
    holders = conn.execute(
        sa.text(f"""SELECT number, lease_token FROM {S}.dataset_version_holders
                     WHERE project_id = :p ORDER BY number"""),
        {"p": project_id},
    ).all()
    published = [h.number for h in holders if version_folder(versions_dir, h.number).exists()]
    if published:
        version_published(conn, project_id, published)
    waiting = [h for h in holders if h.number not in published]
    live = live_tokens(conn.engine, {h.lease_token.hex for h in waiting} - {token.hex})
    return next((h.number for h in waiting if h.lease_token.hex not in live), None)


def version_published(conn: sa.Connection, project_id: int, numbers: list[int]) -> None:
    """`numbers` are published (in the transaction that publishes their folders): no build holds
    them any more, and none is given them again."""
    conn.execute(
        sa.text(f"""DELETE FROM {S}.dataset_version_holders
                     WHERE project_id = :p AND number = ANY(:n)"""),
        {"p": project_id, "n": list(numbers)},
    )
