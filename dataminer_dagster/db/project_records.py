"""The projects table: registering a project (its config, its output directory) and reading
projects back."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from dataminer_dagster.config import ProjectConfig
from dataminer_dagster.core.rsync import is_remote
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.schema import DEAD, DONE, FAILED, SCHEMA
from dataminer_dagster.engine.registry import CATALOG
from dataminer_dagster.paths import DataPaths, check_backup_dest, claim_output_dir

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


class ProjectRecords:
    """The catalog's projects (a part of `Catalog`)."""

    engine: sa.Engine
    store: LeaseStore
    paths: DataPaths

    def _reading(self, conn: sa.Connection | None) -> contextlib.AbstractContextManager:
        """`conn` itself (its transaction goes on), or a connection of its own."""
        return contextlib.nullcontext(conn) if conn is not None else self.engine.connect()

    def register_project(
        self, config: ProjectConfig, *, protected: Mapping[str, Path] | None = None
    ) -> RegisterResult:
        """Create or update a project; a new or changed config queues its catalog run.

        Its output directory must be one it may own (`paths.claim_output_dir`; `protected` adds
        directories to the data directory, which is always protected); registrations take turns,
        so two projects cannot claim one directory at once. Raises UnsafePathError."""
        output_dir = config.output_dir or self.paths.default_project_dir(config.name)
        config_hash = config.config_hash()
        statement = sa.text(f"""
            INSERT INTO {S}.projects (name, config, config_hash, output_dir)
            VALUES (:name, CAST(:config AS jsonb), :hash, :output_dir)
            ON CONFLICT (name) DO UPDATE SET config = EXCLUDED.config, config_hash = EXCLUDED.config_hash,
                   output_dir = EXCLUDED.output_dir, updated_at = now()
            RETURNING id, (xmax = 0) AS created,
                      (SELECT config_hash FROM {S}.projects WHERE name = :name) AS previous_hash
        """)
        with self.engine.begin() as c:
            c.execute(sa.text(f"LOCK TABLE {S}.projects IN SHARE ROW EXCLUSIVE MODE"))
            others = c.execute(
                sa.text(f"SELECT name, output_dir FROM {S}.projects WHERE name <> :name"),
                {"name": config.name},
            ).all()
            if config.backup and not is_remote(config.backup.dest):
                check_backup_dest(Path(config.backup.dest), self.paths.root)
            claim_output_dir(
                output_dir,
                config.name,
                protected={"the data directory": self.paths.root, **(protected or {})},
                projects_dir=self.paths.default_project_dir(config.name).parent,
                others={r.name: Path(r.output_dir) for r in others},
            )
            row = c.execute(
                statement,
                {
                    "name": config.name,
                    "config": json.dumps(config.to_json()),
                    "hash": config_hash,
                    "output_dir": str(output_dir),
                },
            ).one()
            changed = row.created or row.previous_hash != config_hash
            self.store.enqueue(
                CATALOG,
                [config.name],
                project_ids=[row.id],
                reset=(DONE, FAILED, DEAD) if changed else (),
                conn=c,
            )
        return RegisterResult(self.project(config.name), bool(row.created), bool(changed))

    def project(self, name: str) -> ProjectRow | None:
        rows = self._projects("WHERE name = :name", {"name": name})
        return rows[0] if rows else None

    def projects(self) -> list[ProjectRow]:
        return self._projects("ORDER BY name", {})

    def _projects(
        self, clause: str, params: dict, conn: sa.Connection | None = None
    ) -> list[ProjectRow]:
        with self._reading(conn) as c:
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
