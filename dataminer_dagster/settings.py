"""Process-wide settings: one settings file, with environment variables on top.

Everything a deployment tunes lives here, so that the CLI, the Dagster code location, the instance
storage and the tests agree on one source: where the database and the data are, retries, leases,
how runs are watched, how often the sensors look, and each lane's batch size and share of runs.
The file is `$DATAMINER_SETTINGS`, else `$DATAMINER_HOME/settings.yaml` when it exists; every key
is optional (docs/configuration.md, "Settings"). Project-specific choices live in the project config
(config.py), never here.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dataminer_dagster.core.bounded_text import BoundedTextError, read_yaml_file, shown_key

ENV_HOME = "DATAMINER_HOME"
ENV_DATABASE_URL = "DATAMINER_DATABASE_URL"
ENV_DAGSTER_DATABASE_URL = "DATAMINER_DAGSTER_DATABASE_URL"
ENV_DATA_DIR = "DATAMINER_DATA_DIR"
ENV_SETTINGS = "DATAMINER_SETTINGS"
SETTINGS_FILE = "settings.yaml"
ENV_EXECUTOR = "DATAMINER_EXECUTOR"
# How a run executes its steps: in its own process (the default), a process per step, or on
# dagster-celery workers (definitions.py).
EXECUTORS = ("in_process", "multiprocess", "celery")


def executor_name() -> str:
    """$DATAMINER_EXECUTOR, else the in-process executor (checked where it is built)."""
    return os.environ.get(ENV_EXECUTOR) or EXECUTORS[0]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetryPolicy(_Section):
    """How often an item is tried and how long to wait between tries."""

    max_attempts: int = Field(4, ge=1)
    base_delay_s: float = Field(30.0, ge=0)
    max_delay_s: float = Field(3600.0, ge=0)


class LeasePolicy(_Section):
    heartbeat_s: float = Field(15.0, gt=0, description="how often a run proves it is alive")
    stale_after_s: float = Field(
        120.0, gt=0, description="a run silent this long loses its leases and is failed"
    )
    outage_wait_s: float = Field(
        600.0,
        gt=0,
        description="how long a run waits for a database that is down, restarting or out of "
        "disk before it gives up (a run that comes back keeps its leases)",
    )

    @model_validator(mode="after")
    def _stale_after_some_beats(self) -> LeasePolicy:
        if self.stale_after_s < 2 * self.heartbeat_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s:g}) must be at least twice heartbeat_s "
                f"({self.heartbeat_s:g}): a live run would be failed between two heartbeats"
            )
        return self


class RunPolicy(_Section):
    """How the lease reaper judges runs that Dagster still shows as in progress."""

    start_grace_s: float = Field(
        180.0, gt=0, description="a started run with no heartbeat after this long is failed"
    )
    queued_timeout_s: float = Field(
        3600.0, gt=0, description="a run the queue never started in this long is cancelled"
    )
    ahead_wait_s: float = Field(
        900.0, ge=0, description="how long a run requested ahead of its work waits for it"
    )


class SensorPolicy(_Section):
    """Minimum seconds between ticks (dagster-daemon evaluates sensors at most every 5 s)."""

    work_interval_s: int = Field(1, ge=1)
    reaper_interval_s: int = Field(15, ge=1)
    refresh_interval_s: int = Field(60, ge=1)  # how often the refresh crons are looked at


class LongRunningPolicy(_Section):
    """When a lease counts as long-running: held `factor` times longer than its stage's median
    item, and at least `min_s`; `without_history_s` for a stage that has finished nothing yet."""

    factor: float = Field(10.0, gt=1)
    min_s: float = Field(120.0, ge=0)
    without_history_s: float = Field(1800.0, gt=0)


class UiPolicy(_Section):
    """Where a browser reaches the Dagster UI, for the links `dataminer status` prints to the
    partitions of failed and long-running items (at a million videos, the way to a video's page:
    its set's Partitions tab is too large to use there, docs/architecture.md)."""

    url: str = Field(
        "http://127.0.0.1:3000", description="the webserver's address (dataminer services, dg dev)"
    )
    asset_prefix: str | None = Field(
        None, description="the Component's `prefix` where the pipeline is part of another project"
    )


class LanePolicy(_Section):
    batch: int = Field(ge=1, description="partitions per run")
    max_runs: int = Field(ge=1, description="runs of this lane queued or running at once")


class LanePolicyOverride(_Section):
    batch: int | None = Field(None, ge=1)
    max_runs: int | None = Field(None, ge=1)
    ahead: bool | None = Field(
        None,
        description="request the lane's runs while their input is still being produced (the "
        "filter and project lanes do by default); false: only once it is ready",
    )


class SettingsFile(_Section):
    """The settings file's schema (every section and key optional)."""

    retry: RetryPolicy = RetryPolicy()
    leases: LeasePolicy = LeasePolicy()
    runs: RunPolicy = RunPolicy()
    sensors: SensorPolicy = SensorPolicy()
    long_running: LongRunningPolicy = LongRunningPolicy()
    ui: UiPolicy = UiPolicy()
    lanes: dict[str, LanePolicyOverride] = {}


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    home: Path
    database_url: str | None  # None: the embedded server under `home`
    dagster_database_url: str | None  # None: the same server as the claim tables
    data_dir: Path  # videos, frames and caches shared by all projects
    source: Path | None  # the settings file read, if any
    retry: RetryPolicy
    lease: LeasePolicy
    runs: RunPolicy
    sensors: SensorPolicy
    long_running: LongRunningPolicy
    ui: UiPolicy
    lanes: dict[str, LanePolicyOverride]

    @property
    def embedded_pgdata(self) -> Path:
        return self.home / "pg"

    @property
    def protected_dirs(self) -> dict[str, Path]:
        """Directories that no project's output may be, hold or (but for $HOME) lie in, beside
        the data directory."""
        dirs = {"DATAMINER_HOME": self.home, "$HOME": Path.home()}
        if os.environ.get("DAGSTER_HOME"):
            dirs["DAGSTER_HOME"] = Path(os.environ["DAGSTER_HOME"]).expanduser()
        return dirs

    def lane(self, name: str, default: LanePolicy) -> LanePolicy:
        override = self.lanes.get(name)
        if override is None:
            return default
        return default.model_copy(update=override.model_dump(exclude_none=True, exclude={"ahead"}))


class SettingsError(ValueError):
    """The settings file or an environment variable is invalid (the message says which)."""


# Environment variables that override one setting each: (variable, section, key).
ENV_OVERRIDES = (
    ("DATAMINER_MAX_ATTEMPTS", "retry", "max_attempts"),
    ("DATAMINER_RETRY_BASE_SECONDS", "retry", "base_delay_s"),
    ("DATAMINER_RETRY_MAX_SECONDS", "retry", "max_delay_s"),
    ("DATAMINER_HEARTBEAT_SECONDS", "leases", "heartbeat_s"),
    ("DATAMINER_LEASE_STALE_SECONDS", "leases", "stale_after_s"),
    ("DATAMINER_OUTAGE_WAIT_SECONDS", "leases", "outage_wait_s"),
    ("DATAMINER_UI_URL", "ui", "url"),
)


def settings_path(home: Path) -> Path | None:
    explicit = os.environ.get(ENV_SETTINGS)
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise SettingsError(f"{ENV_SETTINGS}={explicit}: no such file")
        return path
    default = home / SETTINGS_FILE
    return default if default.is_file() else None


# A settings file is a few dozen keys; it is read within the bounds a project config is read in
# (core/bounded_text.py), far tighter, since nobody needs more.
MAX_SETTINGS_BYTES = 2**20
MAX_SETTINGS_VALUES = 10_000


def _read_file(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        raw = read_yaml_file(path, max_bytes=MAX_SETTINGS_BYTES, max_values=MAX_SETTINGS_VALUES)
    except BoundedTextError as exc:
        raise SettingsError(f"{path}: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"{path}: {exc.strerror or exc}") from None
    raw = raw or {}
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def _apply_env(raw: dict) -> dict:
    """The file's sections with the environment's overrides on top. A section that is not a
    mapping is left as it is, for the validation to refuse by its name."""
    merged = {
        section: {} if values is None else dict(values) if isinstance(values, dict) else values
        for section, values in raw.items()
    }
    for variable, section, key in ENV_OVERRIDES:
        value = os.environ.get(variable)
        if value not in (None, "") and isinstance(merged.setdefault(section, {}), dict):
            merged[section][key] = value
    return merged


def _allowed_keys(loc: tuple) -> list[str]:
    if loc[0] == "lanes":
        return sorted(LanePolicyOverride.model_fields)
    section = SettingsFile.model_fields.get(str(loc[0])) if len(loc) == 2 else None
    model = section.annotation if section else SettingsFile
    return sorted(model.model_fields)


def _describe(error: ValidationError, path: Path | None) -> str:
    problems = []
    for e in error.errors():
        key = ".".join(shown_key(p) for p in e["loc"])
        variable = next((v for v, s, k in ENV_OVERRIDES if f"{s}.{k}" == key), None)
        if variable and os.environ.get(variable):
            key = f"{key} (from {variable}={os.environ[variable]!r})"
        if e["type"] == "extra_forbidden":
            allowed = ", ".join(_allowed_keys(e["loc"]))
            problems.append(f"{key}: unknown key; allowed: {allowed}")
        else:
            problems.append(f"{key}: {e['msg']}")
    more = len(problems) - _PROBLEMS_SHOWN
    shown = problems[:_PROBLEMS_SHOWN] + ([f"(and {more:,} more problems)"] if more > 0 else [])
    return f"{path or 'settings'}: " + "; ".join(shown)


# The problems of a settings file named in its one-line error; the rest are counted.
_PROBLEMS_SHOWN = 5


def load_settings(file: str | os.PathLike | None = None) -> Settings:
    """The settings of this process: `file` (default: $DATAMINER_SETTINGS, else
    $DATAMINER_HOME/settings.yaml when it exists) with the environment's overrides."""
    home = Path(os.environ.get(ENV_HOME) or ".dataminer").expanduser().resolve()
    data_dir = Path(os.environ.get(ENV_DATA_DIR) or home / "data").expanduser().resolve()
    path = Path(file).expanduser() if file is not None else settings_path(home)
    if path is not None and not path.is_file():
        raise SettingsError(f"settings file {path}: no such file")
    try:
        parsed = SettingsFile.model_validate(_apply_env(_read_file(path)))
    except ValidationError as exc:
        raise SettingsError(_describe(exc, path)) from None
    return Settings(
        home=home,
        database_url=os.environ.get(ENV_DATABASE_URL) or None,
        dagster_database_url=os.environ.get(ENV_DAGSTER_DATABASE_URL) or None,
        data_dir=data_dir,
        source=path,
        retry=parsed.retry,
        lease=parsed.leases,
        runs=parsed.runs,
        sensors=parsed.sensors,
        long_running=parsed.long_running,
        ui=parsed.ui,
        lanes=parsed.lanes,
    )
