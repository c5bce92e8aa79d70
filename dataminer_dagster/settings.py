"""Process-wide settings, read from the environment once per call site.

Everything a deployment changes lives here, so that the CLI, the Dagster code location, the
instance storage and the tests agree on one source. Project-specific choices live in the project
config (config.py), never here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_HOME = "DATAMINER_HOME"
ENV_DATABASE_URL = "DATAMINER_DATABASE_URL"
ENV_DAGSTER_DATABASE_URL = "DATAMINER_DAGSTER_DATABASE_URL"
ENV_DATA_DIR = "DATAMINER_DATA_DIR"


@dataclass(frozen=True)
class RetryPolicy:
    """How often an item is tried and how long to wait between tries."""

    max_attempts: int = 4
    base_delay_s: float = 30.0
    max_delay_s: float = 3600.0


@dataclass(frozen=True)
class LeasePolicy:
    heartbeat_s: float = 15.0  # how often a run proves it is alive
    stale_after_s: float = 120.0  # a run silent this long loses its leases


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str | None  # None: the embedded server under `home`
    dagster_database_url: str | None  # None: the same server as the claim tables
    data_dir: Path  # videos, frames and caches shared by all projects
    retry: RetryPolicy
    lease: LeasePolicy

    @property
    def embedded_pgdata(self) -> Path:
        return self.home / "pg"


def _float_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def load_settings() -> Settings:
    home = Path(os.environ.get(ENV_HOME) or ".dataminer").expanduser().resolve()
    data_dir = Path(os.environ.get(ENV_DATA_DIR) or home / "data").expanduser().resolve()
    return Settings(
        home=home,
        database_url=os.environ.get(ENV_DATABASE_URL) or None,
        dagster_database_url=os.environ.get(ENV_DAGSTER_DATABASE_URL) or None,
        data_dir=data_dir,
        retry=RetryPolicy(
            max_attempts=int(_float_env("DATAMINER_MAX_ATTEMPTS", RetryPolicy.max_attempts)),
            base_delay_s=_float_env("DATAMINER_RETRY_BASE_SECONDS", RetryPolicy.base_delay_s),
            max_delay_s=_float_env("DATAMINER_RETRY_MAX_SECONDS", RetryPolicy.max_delay_s),
        ),
        lease=LeasePolicy(
            heartbeat_s=_float_env("DATAMINER_HEARTBEAT_SECONDS", LeasePolicy.heartbeat_s),
            stale_after_s=_float_env("DATAMINER_LEASE_STALE_SECONDS", LeasePolicy.stale_after_s),
        ),
    )
