"""A project's lifecycle beyond the automatic transitions of project_flow.py: forcing a stage of
the project chain to run again (`dataminer force-<stage>`), and retrying failed work, which brings
failed projects back (`dataminer retry`).

Forcing is one transaction that first locks the work items it changes and checks that none is
running (admin.py's locks): a claim skips locked rows, so no run can take an item meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.core.files import remove
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.deletions import (
    UnknownProject,
    WorkRunning,
    lock_items,
    lock_project,
    running_items,
)
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.project_flow import (
    ACTIVE,
    MEMBER_FINISHED_SQL,
    MEMBERS_JOIN,
    PROJECT_FAILED,
)
from dataminer_dagster.db.schema import BLOCKED, DEAD, DONE, FAILED, PENDING, SCHEMA
from dataminer_dagster.paths import ProjectPaths
from dataminer_dagster.registry import CATALOG, DEDUP

S = SCHEMA
W = f"{S}.work_items"


@dataclass(frozen=True)
class ForcedStage:
    project: str
    stage: str
    previous_stage: str
    unfinished_members: int  # while > 0 the project transitions send it back to active
    earlier_not_done: list[str]  # earlier project stages whose result this stage reads
    frames_released: list[str]  # videos whose frames are extracted (and filtered) again first


def force_stage(catalog: Catalog, name: str, stage: str) -> ForcedStage:
    """Put a project on `stage` (a forceable one: dedup, detect, dataset) and queue that stage's item again, whatever
    the project's stage was. Items of later stages are dropped (they are queued again when their
    turn comes). Refused while this stage's or a later stage's item is running.

    Videos whose frames were released (backup, cleanup) get their extraction queued again and
    their filter item dropped, as for a later project: the project goes back to active until
    they are filtered again, then runs from dedup."""
    if stage not in REGISTRY.forceable:
        raise ValueError(f"only {', '.join(REGISTRY.forceable)} can be forced, not {stage!r}")
    store = catalog.store
    chain = REGISTRY.project_chain
    following = list(chain[chain.index(stage) :])
    with store.engine.begin() as conn:
        project = lock_project(conn, name)
        released = catalog.refilter_released(conn, catalog.projects.get(name))
        items = lock_items(
            conn,
            "project_id = :p AND stage = ANY(CAST(:stages AS text[]))",
            {"p": project.id, "stages": following},
        )
        if running := running_items(items):
            raise WorkRunning(f"cannot force {stage} of project {name}", running)
        conn.execute(
            sa.text(f"""UPDATE {S}.projects SET stage = :stage, error = NULL,
                               stage_changed_at = now(), updated_at = now() WHERE id = :p"""),
            {"stage": stage, "p": project.id},
        )
        conn.execute(
            sa.text(
                f"DELETE FROM {W} WHERE project_id = :p AND stage = ANY(CAST(:later AS text[]))"
            ),
            {"p": project.id, "later": following[1:]},
        )
        store.enqueue(
            stage,
            [name],
            project_ids=[project.id],
            reset=(DONE, FAILED, DEAD, BLOCKED),
            conn=conn,
        )
        unfinished = _unfinished_members(conn, project.id)
        earlier = chain[: chain.index(stage)]
        done = set(
            conn.execute(
                sa.text(f"""SELECT stage FROM {W} WHERE project_id = :p AND status = '{DONE}'
                               AND stage = ANY(CAST(:earlier AS text[]))"""),
                {"p": project.id, "earlier": list(earlier)},
            ).scalars()
        )
    if stage == DEDUP:  # forced: every frame is grouped again, not only the new ones
        remove(ProjectPaths(catalog.projects.get(name).output_dir).dedup_index_dir)
    return ForcedStage(
        name, stage, project.stage, unfinished, [s for s in earlier if s not in done], released
    )


def _unfinished_members(conn: sa.Connection, project_id: int) -> int:
    # coalesce: a member without a filter item yet makes the finished test NULL, not false.
    return conn.execute(
        sa.text(f"""SELECT count(*) FROM {MEMBERS_JOIN}
                     WHERE pv.project_id = :p AND NOT coalesce({MEMBER_FINISHED_SQL}, false)"""),
        {"p": project_id},
    ).scalar_one()


# --- retrying -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryResult:
    items: int  # work items made pending again
    reopened: list[tuple[str, str]]  # (project, stage) of failed projects brought back


def retry(
    store: LeaseStore,
    *,
    project: str | None = None,
    stages: Sequence[str] | None = None,
    statuses: Sequence[str] = (FAILED, DEAD),
) -> RetryResult:
    """Queue failed/dead (or blocked) items again with fresh attempts (LeaseStore.retry), then
    bring back failed projects whose failing project-level item is now pending: to `active` for
    the catalog, to that stage for dedup, detect and dataset."""
    project_id = None
    if project is not None:
        with store.engine.connect() as c:
            project_id = c.execute(
                sa.text(f"SELECT id FROM {S}.projects WHERE name = :n"), {"n": project}
            ).scalar()
        if project_id is None:
            raise UnknownProject(project)
    count = store.retry(stages=stages, project_id=project_id, statuses=statuses)
    return RetryResult(count, reopen_failed_projects(store.engine, project_id))


def reopen_failed_projects(
    engine: sa.Engine, project_id: int | None = None
) -> list[tuple[str, str]]:
    """Failed projects with a pending project-level item go back to the stage of the earliest one
    (compare-and-set on `failed`); returns (project, new stage)."""
    order = [CATALOG, *REGISTRY.project_chain]
    statement = sa.text(f"""
        UPDATE {S}.projects p
           SET stage = CASE WHEN w.stage = '{CATALOG}' THEN '{ACTIVE}' ELSE w.stage END,
               error = NULL, stage_changed_at = now(), updated_at = now()
          FROM (SELECT DISTINCT ON (project_id) project_id, stage FROM {W}
                 WHERE stage = ANY(CAST(:order AS text[])) AND status = '{PENDING}'
                 ORDER BY project_id, array_position(CAST(:order AS text[]), stage)) w
         WHERE p.id = w.project_id AND p.stage = '{PROJECT_FAILED}'
           AND (CAST(:project AS int) IS NULL OR p.id = :project)
        RETURNING p.name, p.stage
    """)
    with engine.begin() as c:
        rows = c.execute(statement, {"order": order, "project": project_id}).all()
    return sorted((r.name, r.stage) for r in rows)
