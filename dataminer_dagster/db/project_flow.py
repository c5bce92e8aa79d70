"""Project stages: the monitor worker's job, as compare-and-set transitions on the claim tables.

    active --(catalog done, every member video finished)--> dedup --> detect --> dataset --> complete
       ^                                                     |          |          |
       +---- new unfinished members (never while a stage's item is running) ------+---- also from
                                                                                         complete/failed
A member video is finished when its filter item is done, dead or blocked for this project, or when
its download or extraction is dead or blocked. A copy of another video is finished once its
download is: its filter item is marked done, and the project is linked to the original, a
member like any other (Catalog.advance_videos); only the original's filter feeds the dataset. A project with no member video, or none whose filter
is done (each dead or blocked), fails instead of completing with an empty dataset. A dead
project-stage item fails the project with its error; `dataminer retry` or new videos bring it
back.

A changed config (registered again) is followed here too: work done or died under an earlier
config of the project is stale (its stage's fingerprint differs, ProjectConfig.fingerprints).
Stale filter items make their members unfinished (the project reopens; Catalog.advance_videos
queues them again); a stale catalog queues the catalog again; a stale stage of the chain takes
the project back to that stage, and the stages after it run again in turn.

Only projects whose rows changed are looked at: triggers note them in `project_changes` with each
change (migration 0011), so a tick with nothing new reads one small table, however large the
catalog (every project is looked at too, as a safety net, on a process's first call and hourly).
A project's members are read only as far as its decision needs (whether one is unfinished stops
at the first; the counts, at the move to dedup or a reopening, read them all).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass

import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.outages import outages_of, wait_out
from dataminer_dagster.db.schema import (
    BLOCKED,
    DEAD,
    DONE,
    FAILED,
    INPUT_REDONE,
    RUNNING,
    SCHEMA,
    project_video_key_sql,
    stale_sql,
)
from dataminer_dagster.registry import CATALOG, DOWNLOAD, FILTER, FRAMES

S = SCHEMA
ACTIVE, COMPLETE, PROJECT_FAILED = "active", "complete", "failed"

# A member is finished for its project when one of these holds (a filter done or dead under an
# earlier config of the project is not: it is filtered again).
MEMBER_FINISHED_SQL = f"""coalesce(
    fi.status IN ('{DONE}', '{DEAD}') AND NOT {stale_sql("fi", f"p.fingerprints ->> '{FILTER}'")}
    OR fi.status = '{BLOCKED}'
    OR d.status IN ('{DEAD}', '{BLOCKED}')
    OR f.status IN ('{DEAD}', '{BLOCKED}'), false)"""  # missing items (NULL) mean: not finished

MEMBERS_JOIN = f"""
    {S}.project_videos pv
    JOIN {S}.projects p ON p.id = pv.project_id
    LEFT JOIN {S}.work_items fi ON fi.stage = '{FILTER}' AND fi.item_key = {project_video_key_sql("p.name", "pv.video_id")}
    LEFT JOIN {S}.work_items d ON d.stage = '{DOWNLOAD}' AND d.item_key = pv.video_id
    LEFT JOIN {S}.work_items f ON f.stage = '{FRAMES}' AND f.item_key = pv.video_id
"""


@dataclass(frozen=True)
class Transition:
    project: str
    old: str
    new: str
    reason: str


class _Members:
    """What a project's member videos add up to, read only as far as a decision needs: whether
    one is unfinished stops at the first one found; the counts read every member."""

    def __init__(self, engine: sa.Engine, project_id: int) -> None:
        self._engine, self._project_id = engine, project_id

    @functools.cached_property
    def any_unfinished(self) -> bool:
        if "counts" in self.__dict__:
            return self.counts.unfinished > 0
        with self._engine.connect() as c:
            return bool(
                c.execute(
                    sa.text(f"""SELECT EXISTS (SELECT 1 FROM {MEMBERS_JOIN}
                                 WHERE pv.project_id = :p AND NOT {MEMBER_FINISHED_SQL})"""),
                    {"p": self._project_id},
                ).scalar()
            )

    @functools.cached_property
    def counts(self) -> _MemberCounts:
        with self._engine.connect() as c:
            row = c.execute(
                sa.text(f"""SELECT count(*) AS members,
                                   count(*) FILTER (WHERE NOT {MEMBER_FINISHED_SQL}) AS unfinished,
                                   count(*) FILTER (WHERE fi.status = '{DONE}'
                                                      AND NOT coalesce(fi.outcome ? 'same_as', false)) AS usable
                              FROM {MEMBERS_JOIN} WHERE pv.project_id = :p"""),
                {"p": self._project_id},
            ).one()
        return _MemberCounts(row.members, row.unfinished, row.usable)


@dataclass(frozen=True)
class _MemberCounts:
    members: int
    unfinished: int
    usable: int  # members whose own filter is done (not a copy's): the ones that feed the dataset


@dataclass(frozen=True)
class _ProjectState:
    id: int
    name: str
    stage: str
    members: _Members
    items: dict[str, tuple[str, str | None]]  # project-level stage -> (status, last error)
    stale: frozenset[str] = frozenset()  # project-level stages done or dead under an earlier config


def advance_projects(store: LeaseStore) -> list[Transition]:
    """Move every project whose rows changed since the last call as far as its state allows;
    returns what changed. The changes are noted by the database's triggers, in the transaction
    of each change (migration 0011): a call costs what changed, not the catalog; the notes it
    read are removed once it has acted on them, so a call that fails leaves them to the next.
    In a process that waits for the database, an outage meanwhile is waited out and the call
    made again (safe: a project moves only from the stage it was read in)."""
    return wait_out(lambda: _advance(store), outages_of(store.engine.url))


def _advance(store: LeaseStore) -> list[Transition]:
    notes, changed = _changed_projects(store.engine)
    transitions = []
    for state in _states(store.engine, changed):
        change = _next(state)
        if change is None:
            continue
        new, reason, enqueue = change
        with store.engine.begin() as conn:
            moved = conn.execute(
                sa.text(f"""UPDATE {S}.projects SET stage = :new, stage_changed_at = now(), updated_at = now(),
                                   error = CASE WHEN :new = '{PROJECT_FAILED}' THEN :reason ELSE NULL END
                             WHERE id = :id AND stage = :old RETURNING id"""),
                {"new": new, "old": state.stage, "id": state.id, "reason": reason},
            ).first()
            if moved is None:
                continue  # someone else moved it meanwhile
            if new == ACTIVE:  # reopened: forget queued project stages, they run again later
                conn.execute(
                    sa.text(f"""DELETE FROM {S}.work_items WHERE project_id = :id
                                   AND stage = ANY(CAST(:stages AS text[])) AND status <> '{RUNNING}'"""),
                    {"id": state.id, "stages": list(REGISTRY.project_chain)},
                )
            if enqueue:
                store.enqueue(
                    enqueue,
                    [state.name],
                    project_ids=[state.id],
                    reset=(DONE, FAILED, DEAD),
                    conn=conn,
                )
        transitions.append(Transition(state.name, state.stage, new, reason))
    _forget_notes(store.engine, notes)
    return transitions


# Every project is looked at, whatever the notes say, on a process's first call and then at most
# this often: the safety net for the one change the notes can miss. A trigger names the projects
# linked to a video when its item changes; a link committed before that change, and acted on
# before it, leaves the new project unnamed.
ALL_PROJECTS_EVERY_S = 3600.0
_all_looked_at: dict[str, float] = {}


def _changed_projects(engine: sa.Engine) -> tuple[list[int], list[int]]:
    """(the notes of changed projects, the projects to look at: theirs, or every project when
    the safety net is due)."""
    with engine.connect() as c:
        rows = c.execute(sa.text(f"SELECT id, project_id FROM {S}.project_changes")).all()
        projects = {r.project_id for r in rows}
        database, now = engine.url.render_as_string(hide_password=True), time.monotonic()
        if now - _all_looked_at.get(database, -math.inf) >= ALL_PROJECTS_EVERY_S:
            _all_looked_at[database] = now
            projects |= set(c.execute(sa.text(f"SELECT id FROM {S}.projects")).scalars())
    return [r.id for r in rows], sorted(projects)


def _forget_notes(engine: sa.Engine, notes: list[int]) -> None:
    """Remove the notes read (by id: a note committed meanwhile stays for the next call)."""
    if notes:
        with engine.begin() as c:
            c.execute(
                sa.text(f"DELETE FROM {S}.project_changes WHERE id = ANY(CAST(:ids AS bigint[]))"),
                {"ids": notes},
            )


def stale_later_stages(conn: sa.Connection, project_id: int, stage: str) -> None:
    """A stage of the project chain done (again, by `redo` or `force-<stage>`): the project's
    later stages, finished from its earlier output, are stale, and run again after it."""
    chain = REGISTRY.project_chain
    if stage not in chain:
        return
    conn.execute(
        sa.text(f"""UPDATE {S}.work_items SET fingerprint = '{INPUT_REDONE}'
                     WHERE project_id = :p AND stage = ANY(CAST(:later AS text[]))
                       AND status IN ('{DONE}', '{DEAD}')"""),
        {"p": project_id, "later": list(chain[chain.index(stage) + 1 :])},
    )


def _next(state: _ProjectState) -> tuple[str, str, str | None] | None:
    """(new stage, reason, project stage to queue) or None."""
    chain = REGISTRY.project_chain
    running = any(status == RUNNING for status, _ in state.items.values())
    if CATALOG in state.stale and not running:
        return ACTIVE, "its inputs changed: the catalog runs again", CATALOG
    if state.stage != ACTIVE and not running and state.members.any_unfinished:
        unfinished = state.members.counts.unfinished
        return ACTIVE, f"{unfinished} member videos are not finished", None
    redo = _first_stale_stage(state, chain)
    if redo is not None and not running:
        return redo, f"{redo} was done with an earlier config", redo
    if state.stage == ACTIVE:
        catalog, catalog_error = state.items.get(CATALOG, (None, None))
        if catalog == DEAD:
            return PROJECT_FAILED, f"catalog failed: {catalog_error}", None
        if catalog != DONE or state.members.any_unfinished:
            return None
        counts = state.members.counts
        if counts.members == 0:
            return PROJECT_FAILED, "no video was found for this project", None
        if counts.usable == 0:
            return (
                PROJECT_FAILED,
                f"none of its {counts.members} videos could be used: each one's download, "
                f"extraction or filter ended dead or blocked (dataminer status {state.name} "
                "lists why)",
                None,
            )
        return chain[0], f"all {counts.members} member videos finished", chain[0]
    if state.stage in chain:
        status, error = state.items.get(state.stage, (None, None))
        if status is None:  # lost its item (e.g. deleted by hand): queue it again
            return None if running else (state.stage, "re-queued", state.stage)
        if status == DONE:
            position = chain.index(state.stage)
            if position + 1 == len(chain):
                return COMPLETE, "every stage is done", None
            following = chain[position + 1]
            return following, f"{state.stage} done", following
        if status == DEAD:
            return PROJECT_FAILED, f"{state.stage} failed: {error}", None
    return None


def _first_stale_stage(state: _ProjectState, chain: tuple[str, ...]) -> str | None:
    """The first stage of the chain, up to the project's own, whose work was done (or died) under
    an earlier config: the project goes back to it, and what follows runs again after it."""
    if state.stage == ACTIVE:  # its members are not all finished: the chain has not begun
        return None
    reached = len(chain) if state.stage not in chain else chain.index(state.stage) + 1
    return next((stage for stage in chain[:reached] if stage in state.stale), None)


def _states(engine: sa.Engine, project_ids: list[int]) -> list[_ProjectState]:
    if not project_ids:
        return []
    with engine.connect() as c:
        projects = c.execute(
            sa.text(f"""SELECT id, name, stage FROM {S}.projects
                         WHERE id = ANY(CAST(:ids AS integer[])) ORDER BY id"""),
            {"ids": project_ids},
        ).all()
        items: dict[int, dict[str, tuple[str, str | None]]] = {}
        stale: dict[int, set[str]] = {}
        for r in c.execute(
            sa.text(f"""SELECT project_id, stage, status, last_error,
                               status IN ('{DONE}', '{DEAD}') AND {stale_sql("w")} AS stale
                          FROM {S}.work_items w WHERE project_id = ANY(CAST(:ids AS integer[]))
                           AND stage = ANY(CAST(:stages AS text[]))"""),
            {"stages": [CATALOG, *REGISTRY.project_chain], "ids": project_ids},
        ):
            items.setdefault(r.project_id, {})[r.stage] = (r.status, r.last_error)
            if r.stale:
                stale.setdefault(r.project_id, set()).add(r.stage)
    return [
        _ProjectState(
            p.id,
            p.name,
            p.stage,
            _Members(engine, p.id),
            items.get(p.id, {}),
            frozenset(stale.get(p.id, ())),
        )
        for p in projects
    ]


def project_members(engine: sa.Engine, project_id: int) -> list[sa.Row]:
    """Member videos with their per-stage statuses (for status reports and project stages)."""
    with engine.connect() as c:
        return c.execute(
            sa.text(f"""SELECT pv.video_id, pv.frames_total, pv.frames_passed, d.status AS download,
                               f.status AS frames, fi.status AS filter, {MEMBER_FINISHED_SQL} AS finished
                          FROM {MEMBERS_JOIN} WHERE pv.project_id = :id ORDER BY pv.id"""),
            {"id": project_id},
        ).all()
