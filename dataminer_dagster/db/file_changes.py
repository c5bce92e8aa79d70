"""Files changed for a transaction, settled on the COMMIT's real outcome (`committing`).

A stage publishes its outputs and moves released frames aside inside the transaction that records
them, so that the database and the disk change together. But a COMMIT can fail after everything
before it went through: a deferred constraint, a backend terminated, a lost connection. And
SQLAlchemy's `commit` event fires *before* the COMMIT reaches the server. So the changes are
settled only once `commit()` has returned or failed:

* committed: what was set aside (released frames, an output replaced) is deleted;
* not committed (the server answered with an error, or the block raised): every change is undone,
  in reverse order: a published output goes back to its staging path, what it replaced and what
  was set aside go back in place;
* unknown (the connection was lost during COMMIT): `committing`'s `confirm` reads the outcome
  back on a new connection (a completion: its item, by its lease token) and settles on that. Where
  it cannot be told, nothing is deleted: set-aside folders go back in place and a published
  output stays, what it replaced left as a hidden leftover (`core/files.py`).

A publish is fenced by its lease: it needs the transaction of the lease's completion
(`LeaseStore.completing`), whose first statement checks the token and locks the item's row until
COMMIT, so no reaper takes the lease in between and a holder that lost it publishes nothing. The
hidden names of what is set aside carry the token, and `live_tokens` tells a later writer which
leftovers are still a live holder's (`core/files.py` `remove_leftovers`).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.core.files import remove, remove_leftovers, set_aside
from dataminer_dagster.db.schema import RUNNING, SCHEMA

# The transactions `committing` has open, by connection (not the connection's `info`: that is
# the pooled connection's, and cannot be read once a lost connection has been invalidated).
_open: weakref.WeakKeyDictionary[sa.Connection, FileChanges] = weakref.WeakKeyDictionary()


class CommitOutcomeUnknown(Exception):
    """The connection was lost during COMMIT and the outcome could not be read back: nothing was
    deleted; the next holder of the work finds out what stands."""


@dataclass(frozen=True)
class _Change:
    committed: Callable[[], None]
    undo: Callable[[], None]
    unknown: Callable[[], None]


def _nothing() -> None:
    return None


class FileChanges:
    """The file changes of one transaction, settled once its outcome is known. `token`: the lease
    (hex) whose completion the transaction is, which the transaction has checked; None for one
    that completes no lease (it may set aside, never publish)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self._changes: list[_Change] = []

    def set_aside(self, path: Path) -> Path | None:
        """Move `path` out of its place now (one rename: never left half-deleted there); delete it
        once the transaction committed, put it back otherwise. None when there is nothing."""
        if not path.exists():
            return None
        aside = set_aside(path, self.token)

        def put_back() -> None:
            os.replace(aside, path)

        self._changes.append(_Change(lambda: remove(aside), put_back, put_back))
        return aside

    def publish(self, staged: Path, final: Path) -> None:
        """Move `staged` into `final`'s place now, setting aside what was there: the old one is
        deleted once the transaction committed; otherwise the new one goes back to `staged` and
        the old one back in place. Only in a lease's completion, which checked its token."""
        if self.token is None:
            raise RuntimeError(
                f"{final} can only be published in the transaction of a lease's completion "
                "(LeaseStore.completing), which checks that the lease is still held"
            )
        old = set_aside(final, self.token) if final.exists() else None
        os.replace(staged, final)

        def delete_old() -> None:
            if old is not None:
                remove(old)

        def undo() -> None:
            os.replace(final, staged)
            if old is not None:
                os.replace(old, final)

        self._changes.append(_Change(delete_old, undo, _nothing))

    def settle(self, committed: bool | None) -> None:
        """Apply the outcome to every change (undoing in reverse order); the first error is
        raised once every change has been tried."""
        changes = self._changes if committed else list(reversed(self._changes))
        self._changes = []
        first: BaseException | None = None
        for change in changes:
            action = {True: change.committed, False: change.undo, None: change.unknown}[committed]
            try:
                action()
            except OSError as error:
                first = first or error
        if first is not None:
            raise first


def file_changes(conn: sa.Connection) -> FileChanges:
    """The file changes of `conn`'s transaction, which `committing` opened."""
    changes = _open.get(conn)
    if changes is None:
        raise RuntimeError(
            "file changes need a transaction opened by db.file_changes.committing, which settles "
            "them on the COMMIT's outcome"
        )
    return changes


@contextmanager
def committing(
    engine: sa.Engine,
    confirm: Callable[[sa.Connection], bool | None] | None = None,
    token: str | None = None,
) -> Iterator[sa.Connection]:
    """A transaction (as `engine.begin()`) whose file changes (`file_changes`) settle on the
    outcome of its COMMIT. `confirm` reads, on a new connection, whether a commit whose
    connection was lost went through (True), did not (False) or cannot be told (None); an
    interrupt (a run's Terminate) raised during COMMIT is read back the same way, then raised.
    `token`: the lease (hex) the transaction completes, once its first statement has checked it."""
    changes = FileChanges(token)
    with engine.connect() as conn:
        _open[conn] = changes
        try:
            transaction = conn.begin()
            try:
                yield conn
            except BaseException:
                try:
                    transaction.rollback()
                finally:
                    changes.settle(False)
                raise
            try:
                transaction.commit()
            except BaseException as error:
                outcome = _read_back(engine, error, confirm)
                changes.settle(outcome)
                if outcome is False or not isinstance(error, sa.exc.DBAPIError):
                    raise  # refused; or an interrupt, which goes on whatever the COMMIT did
                if outcome is None:
                    raise CommitOutcomeUnknown(
                        f"the connection to the database was lost during COMMIT and whether it "
                        f"went through could not be read back ({error}); no file was deleted"
                    ) from error
            else:
                changes.settle(True)
        finally:
            _open.pop(conn, None)


def _read_back(
    engine: sa.Engine,
    error: BaseException,
    confirm: Callable[[sa.Connection], bool | None] | None,
) -> bool | None:
    """The outcome of a COMMIT that raised `error`."""
    if isinstance(error, sa.exc.DBAPIError) and not error.connection_invalidated:
        return False  # the server answered: the transaction was rolled back
    if confirm is None:
        return None
    try:
        with engine.begin() as conn:
            return confirm(conn)
    except sa.exc.DBAPIError:
        return None


def live_tokens(
    engine: sa.Engine, tokens: Collection[str], staging: tuple[str, Path] | None = None
) -> set[str]:
    """The lease tokens (hex) among `tokens` whose leases are live: their items still running
    under them. A token once dead (its item finished, failed, released or reaped) never lives
    again, so what it left behind may go (`core/files.py` `remove_leftovers`). A completion not
    yet committed still holds its token: its publish may be under way.

    `staging`: (token, final) of an output the lease is about to stage, recorded in the same
    statement (table `staged_outputs`), so that what a worker that dies leaves beside `final` is
    found again (`remove_dead_leftovers`)."""
    if not tokens and staging is None:
        return set()
    record = f"""WITH recorded AS (
                     INSERT INTO {SCHEMA}.staged_outputs (lease_token, final_path)
                     VALUES (CAST(:token AS uuid), :final) ON CONFLICT DO NOTHING)"""
    statement = sa.text(f"""
        {record if staging is not None else ""}
        SELECT lease_token FROM {SCHEMA}.work_items
         WHERE status = '{RUNNING}' AND lease_token = ANY(CAST(:tokens AS uuid[]))
    """)
    params: dict = {"tokens": sorted(tokens)}
    if staging is not None:
        params.update(token=staging[0], final=str(Path(staging[1]).absolute()))
    with engine.begin() as conn:
        rows = conn.execute(statement, params).scalars()
        return {token.hex for token in rows}


def forget_staged(conn: sa.Connection, token: str) -> None:
    """The lease `token` (hex) has removed its staging: no leftover of it is to be looked for."""
    conn.execute(
        sa.text(f"DELETE FROM {SCHEMA}.staged_outputs WHERE lease_token = CAST(:token AS uuid)"),
        {"token": token},
    )


def remove_dead_leftovers(engine: sa.Engine, limit: int = 200) -> list[Path]:
    """Remove what workers that died left beside the outputs they were staging (staging paths,
    outputs set aside: `core/files.py` `remove_leftovers`), once their leases are dead, up to
    `limit` outputs at a time; the paths removed. For the lease reaper: an item that is dead, or
    that no one claims again, has no later holder to remove them. A live holder's stay."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(f"""
                SELECT o.lease_token, o.final_path FROM {SCHEMA}.staged_outputs o
                 WHERE NOT EXISTS (SELECT 1 FROM {SCHEMA}.work_items w
                                    WHERE w.status = '{RUNNING}'
                                      AND w.lease_token = o.lease_token)
                 LIMIT :limit
            """),
            {"limit": limit},
        ).all()
    removed: list[Path] = []
    for row in rows:
        removed += remove_leftovers(Path(row.final_path), lambda t: live_tokens(engine, t))
    if rows:
        with engine.begin() as conn:
            conn.execute(
                sa.text(f"""
                    DELETE FROM {SCHEMA}.staged_outputs o
                     USING unnest(CAST(:tokens AS uuid[]), CAST(:finals AS text[])) AS d(t, f)
                     WHERE o.lease_token = d.t AND o.final_path = d.f
                """),
                {
                    "tokens": [row.lease_token.hex for row in rows],
                    "finals": [row.final_path for row in rows],
                },
            )
    return removed
