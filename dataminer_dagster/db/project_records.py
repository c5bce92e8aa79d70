"""The projects table: registering a project (its config, its output directory) and reading
projects back."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.assets.catalog.config import RefreshConfig
from dataminer_dagster.assets.dataset.dataset_formats import YOLO_DIR, point_yolo_at
from dataminer_dagster.config import ProjectConfig
from dataminer_dagster.core.rsync import is_remote
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DEAD, DONE, RUNNING, SCHEMA
from dataminer_dagster.paths import (
    DataPaths,
    ProjectPaths,
    UnsafePathError,
    check_backup_dest,
    claim_output_dir,
    overlaps,
)
from dataminer_dagster.registry import CATALOG, FILTER

S = SCHEMA


@dataclass(frozen=True)
class ProjectRow:
    id: int
    name: str
    config: ProjectConfig
    config_hash: str
    output_dir: Path
    stage: str
    error: str | None


@dataclass(frozen=True)
class RegisterResult:
    project: ProjectRow
    created: bool
    changed: bool
    changed_keys: tuple[str, ...] = ()  # of the config, against the one registered before
    stale_stages: tuple[str, ...] = ()  # whose work the change makes stale (done again)
    moved_from: Path | None = None  # the earlier output_dir, whose results were moved


class ProjectBusyError(ValueError):
    """A change that cannot be made while the project's work runs."""


def reading(engine: sa.Engine, conn: sa.Connection | None) -> contextlib.AbstractContextManager:
    """`conn` itself (its transaction goes on), or a connection of its own."""
    return contextlib.nullcontext(conn) if conn is not None else engine.connect()


class ProjectRecords:
    """The catalog's projects (`Catalog.projects`). A config change that concerns the per-video
    chain hands the project's videos to `advance_videos`, the catalog's rule for each video's
    next work item."""

    def __init__(
        self,
        engine: sa.Engine,
        store: LeaseStore,
        paths: DataPaths,
        advance_videos: Callable[[sa.Connection, Sequence[str]], int],
    ):
        self.engine = engine
        self.store = store
        self.paths = paths
        self.advance_videos = advance_videos

    def register(
        self, config: ProjectConfig, *, protected: Mapping[str, Path] | None = None
    ) -> RegisterResult:
        """Create or update a project. A new project's catalog is queued. A changed config makes
        stale the work it changes (the stages whose fingerprint differs, ProjectConfig.fingerprints):
        the project flow and the per-video chain do that work again, and only that; a new
        output_dir receives the results of the old one (refused while the project's work runs).

        Its output directory must be one it may own (`paths.claim_output_dir`; `protected` adds
        directories to the data directory, which is always protected); registrations take turns,
        so two projects cannot claim one directory at once. Raises UnsafePathError and
        ProjectBusyError."""
        output_dir = config.output_dir or self.paths.default_project_dir(config.name)
        fingerprints = config.fingerprints()
        statement = sa.text(f"""
            INSERT INTO {S}.projects (name, config, config_hash, output_dir, fingerprints)
            VALUES (:name, CAST(:config AS jsonb), :hash, :output_dir, CAST(:fingerprints AS jsonb))
            ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, config_hash = EXCLUDED.config_hash,
                   output_dir = EXCLUDED.output_dir, fingerprints = EXCLUDED.fingerprints,
                   updated_at = now()
            RETURNING id, (xmax = 0) AS created
        """)
        with self.engine.begin() as c:
            c.execute(sa.text(f"LOCK TABLE {S}.projects IN SHARE ROW EXCLUSIVE MODE"))
            others = c.execute(
                sa.text(f"SELECT name, output_dir FROM {S}.projects WHERE name <> :name"),
                {"name": config.name},
            ).all()
            earlier = c.execute(
                sa.text(f"""SELECT id, config, config_hash, output_dir FROM {S}.projects
                             WHERE name = :name"""),
                {"name": config.name},
            ).first()
            moved_from = _moved_output_dir(earlier, output_dir)
            if moved_from is not None:
                _refuse_while_running(c, earlier.id, config.name, "output_dir")
                if overlaps(moved_from, output_dir):
                    raise UnsafePathError(
                        f"output_dir {output_dir} overlaps the project's earlier output directory "
                        f"{moved_from}, whose results move there; choose a directory beside it"
                    )
            if config.backup and not is_remote(config.backup.dest):
                check_backup_dest(Path(config.backup.dest), self.paths.root)
            claim_output_dir(
                output_dir,
                config.name,
                protected={"the data directory": self.paths.root, **(protected or {})},
                projects_dir=self.paths.default_project_dir(config.name).parent,
                others={r.name: Path(r.output_dir) for r in others},
            )
            if earlier is not None and earlier.config_hash != config.config_hash():
                _stamp_unversioned_work(c, earlier)
            row = c.execute(
                statement,
                {
                    "name": config.name,
                    "config": json.dumps(config.to_json()),
                    "hash": config.config_hash(),
                    "output_dir": str(output_dir),
                    "fingerprints": json.dumps(fingerprints),
                },
            ).one()
            self.store.enqueue(CATALOG, [config.name], project_ids=[row.id], conn=c)
            changed_keys, stale = _what_changed(earlier, config)
            if FILTER in stale or "backup" in {k.split(".")[0] for k in changed_keys}:
                # the per-video chain queues the filter again (its frames first, for a new
                # extraction profile) and a backup to a new destination
                self.advance_videos(c, self._member_ids(c, row.id))
            if moved_from is not None:
                move_outputs(moved_from, output_dir)  # last: a failure above moved nothing
        return RegisterResult(
            self.get(config.name),
            bool(row.created),
            earlier is None or bool(changed_keys),
            tuple(changed_keys),
            tuple(stale),
            moved_from,
        )

    def _member_ids(self, conn: sa.Connection, project_id: int) -> list[str]:
        return list(
            conn.execute(
                sa.text(
                    f"SELECT video_id FROM {S}.project_videos WHERE project_id = :p ORDER BY id"
                ),
                {"p": project_id},
            ).scalars()
        )

    def get(self, name: str) -> ProjectRow | None:
        rows = self.select("WHERE name = :name", {"name": name})
        return rows[0] if rows else None

    def all(self) -> list[ProjectRow]:
        return self.select("ORDER BY name", {})

    def select(
        self, clause: str, params: dict, conn: sa.Connection | None = None
    ) -> list[ProjectRow]:
        """The projects that `clause` (SQL after `FROM projects`) selects; read in `conn`'s
        transaction when given."""
        with reading(self.engine, conn) as c:
            rows = c.execute(sa.text(f"SELECT * FROM {S}.projects {clause}"), params).all()
        return [
            ProjectRow(
                id=r.id,
                name=r.name,
                config=ProjectConfig.model_validate(r.config),
                config_hash=r.config_hash,
                output_dir=Path(r.output_dir),
                stage=r.stage,
                error=r.error,
            )
            for r in rows
        ]

    def member_counts(self) -> dict[int, int]:
        """{project id: number of linked videos}"""
        with self.engine.connect() as c:
            rows = c.execute(
                sa.text(f"SELECT project_id, count(*) FROM {S}.project_videos GROUP BY 1")
            ).all()
        return dict(rows)


def _what_changed(earlier: sa.Row | None, config: ProjectConfig) -> tuple[list[str], list[str]]:
    """(the config keys that changed, the stages whose work they make stale)."""
    if earlier is None:
        return [], []
    before = _parsed(earlier.config)
    if before is None:  # written by a version whose schema this one refuses: all of it is new
        return ["(the whole config)"], list(config.fingerprints())
    keys = config.changed_keys(before)
    old, new = before.fingerprints(), config.fingerprints()
    return keys, [stage for stage, fingerprint in new.items() if old.get(stage) != fingerprint]


def _parsed(stored: dict) -> ProjectConfig | None:
    try:
        return ProjectConfig.model_validate(stored)
    except ValueError:
        return None


def _stamp_unversioned_work(conn: sa.Connection, earlier: sa.Row) -> None:
    """Work finished before fingerprints were recorded (a mark, or an older version) gets the
    fingerprints of the config it was done with, the one being replaced, so that the change
    makes it stale where it should (a config this version cannot read: stale everywhere)."""
    before = _parsed(earlier.config)
    conn.execute(
        sa.text(f"""UPDATE {S}.work_items SET fingerprint = coalesce(
                           CAST(:fingerprints AS jsonb) ->> stage, 'unknown')
                     WHERE project_id = :p AND fingerprint IS NULL
                       AND status IN ('{DONE}', '{DEAD}')
                       AND NOT coalesce(outcome ? 'same_as', false)"""),
        {"p": earlier.id, "fingerprints": json.dumps(before.fingerprints() if before else {})},
    )


def _moved_output_dir(earlier: sa.Row | None, output_dir: Path) -> Path | None:
    """The earlier output_dir of a project that now names another, when it holds results."""
    if earlier is None or Path(earlier.output_dir) == Path(output_dir):
        return None
    old = Path(earlier.output_dir)
    return old if old.is_dir() else None


def _refuse_while_running(conn: sa.Connection, project_id: int, name: str, key: str) -> None:
    running = conn.execute(
        sa.text(f"""SELECT count(*) FROM {S}.work_items
                     WHERE project_id = :p AND status = '{RUNNING}'"""),
        {"p": project_id},
    ).scalar_one()
    if running:
        raise ProjectBusyError(
            f"project {name}: {key} cannot change while {running} of its work items run; "
            "register the new config once they are done (dataminer status " + name + ")"
        )


def move_outputs(old: Path, new: Path) -> None:
    """Move a project's results from its old output directory into its new one (claimed, so
    empty but for its marker), then remove the old one."""
    marker = ProjectPaths(old).marker.name
    for entry in sorted(old.iterdir()):
        if entry.name != marker:
            shutil.move(str(entry), str(new / entry.name))
    (old / marker).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something the project did not write stays with it
        old.rmdir()
    # Ultralytics reads data.yaml's path as it is written: it must name the new place.
    point_yolo_at(ProjectPaths(new).dataset_dir / YOLO_DIR)


def project_columns(engine: sa.Engine, names: Sequence[str], column: str) -> dict[str, object]:
    """One column (`id` or `stage`) of each named project's row, by name; a name no project has
    is left out."""
    if column not in ("id", "stage"):
        raise ValueError(f"project_columns reads id or stage, not {column!r}")
    with engine.connect() as c:
        rows = c.execute(
            sa.text(
                f"SELECT name, {column} FROM {S}.projects WHERE name = ANY(CAST(:n AS text[]))"
            ),
            {"n": list(names)},
        ).all()
    return dict(rows)


def project_fingerprints(
    engine: sa.Engine, up_to_id: int, project_ids: Sequence[int] | None = None
) -> dict[str, dict[str, str]]:
    """{project name: {stage: fingerprint}} of the projects with an id up to `up_to_id` (those
    that are Dagster partitions already), of `project_ids` only where given."""
    with engine.connect() as c:
        rows = c.execute(
            sa.text(f"""SELECT name, fingerprints FROM {S}.projects WHERE id <= :up_to
                         AND (CAST(:ids AS int[]) IS NULL OR id = ANY(CAST(:ids AS int[])))"""),
            {"up_to": up_to_id, "ids": None if project_ids is None else list(project_ids)},
        ).all()
    return {name: dict(fingerprints or {}) for name, fingerprints in rows}


def stage_fingerprint(engine: sa.Engine, project: str, stage: str) -> str | None:
    """A project's current fingerprint of one stage (None: no such project)."""
    with engine.connect() as c:
        return c.execute(
            sa.text(f"SELECT fingerprints ->> :stage FROM {S}.projects WHERE name = :name"),
            {"stage": stage, "name": project},
        ).scalar_one_or_none()


def followed_sources(engine: sa.Engine) -> dict[str, RefreshConfig]:
    """name -> `inputs.refresh` of every project that lists its sources on a schedule, in the
    order they were registered."""
    with engine.connect() as c:
        rows = c.execute(
            sa.text(f"""SELECT name, config -> 'inputs' -> 'refresh' AS refresh FROM {S}.projects
                         WHERE jsonb_typeof(config -> 'inputs' -> 'refresh') = 'object'
                         ORDER BY id""")
        ).all()
    return {name: RefreshConfig.model_validate(refresh) for name, refresh in rows}
