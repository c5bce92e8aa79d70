"""The claim tables as a Dagster resource: this run's leases (kept alive by a heartbeat thread
between setup and teardown) and the catalog of projects and videos."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack

import dagster as dg
import sqlalchemy as sa
from pydantic import PrivateAttr

from dataminer_dagster.assets.download.config import DownloadConfig
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.db.outages import Outages, outages_of, waiting_for_the_database
from dataminer_dagster.db.run_leases import RunLeases
from dataminer_dagster.db.served_data import require_served_data_dir
from dataminer_dagster.db.server import claims_database_url
from dataminer_dagster.db.shared_throttle import SharedThrottle
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.resources.ahead import is_ahead, wait_for_input
from dataminer_dagster.settings import Settings, load_settings

_log = logging.getLogger(__name__)


class DatabaseResource(dg.ConfigurableResource):
    """Claims work for the current run and records results. With no configuration it uses
    $DATAMINER_DATABASE_URL, or the embedded PostgreSQL under $DATAMINER_HOME.

    Set up once per run (the in-process executor) it starts the run's heartbeat, and a run the
    sensors requested ahead of its input waits here for that input (resources/ahead.py). Until
    teardown the run waits out database outages (db/outages.py) instead of failing its items,
    and items it still holds at the end of a step that met one go back uncounted.

    `settings_file`: the settings file to read (default: $DATAMINER_SETTINGS, else
    $DATAMINER_HOME/settings.yaml), so that a code location built with another one
    (`build_definitions(settings=...)`) uses it in its runs and sensors too."""

    database_url: str | None = None
    data_dir: str | None = None
    heartbeat_seconds: float | None = None
    settings_file: str | None = None

    _settings: Settings | None = PrivateAttr(default=None)
    _store: LeaseStore | None = PrivateAttr(default=None)
    _run_leases: RunLeases | None = PrivateAttr(default=None)
    _url: str | None = PrivateAttr(default=None)  # the claim tables' database, once chosen
    _waiting: ExitStack = PrivateAttr(default_factory=ExitStack)
    _outages_before: int = PrivateAttr(default=0)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        settings = load_settings(self.settings_file)
        self._settings = settings
        run = context.run
        if run is not None:
            self._waiting.enter_context(waiting_for_the_database(settings.lease))
        self._store = self._claims_store(settings)
        if run is not None:
            self._outages_before = outages_of(self._store.engine.url).begun
            heartbeat = self.heartbeat_seconds or settings.lease.heartbeat_s
            self._run_leases = RunLeases(
                self._store,
                run.run_id,
                heartbeat_s=heartbeat,
                stale_after_s=settings.lease.stale_after_s,
                outage_wait_s=settings.lease.outage_wait_s,
            )
            self._run_leases.start()
            if is_ahead(run):
                wait_for_input(
                    self._store,
                    context.instance,
                    run,
                    max_wait_s=settings.runs.ahead_wait_s,
                    log=context.log.info if context.log else _log.info,
                )

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        with self._waiting:
            self._release_what_is_held(context)

    def _release_what_is_held(self, context: dg.InitResourceContext) -> None:
        leases = self._run_leases
        if leases is None:
            return
        leases.stop()
        held = leases.held  # only left when the step ended without finishing an item
        outage = outages_of(leases.store.engine.url).begun != self._outages_before
        if held and _being_cancelled(context):
            # A person stopped the run: the items did nothing wrong, so no attempt is counted.
            leases.release_many(held)
            outcome = "released uncounted: the run was cancelled"
        elif held and outage:
            leases.release_many(held)
            outcome = "released uncounted: the database was unreachable during the step"
        else:
            for lease in held:
                leases.fail(lease, "the step ended before finishing this item")
            outcome = "released after the step ended early"
        for lease in held:
            if context.log:
                context.log.warning(f"{lease.stage} {lease.key}: {outcome}")

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.settings_file)
        return self._settings

    @property
    def store(self) -> LeaseStore:
        if self._store is None:  # used outside a run (sensors, CLI)
            self._store = self._claims_store(self.settings)
        return self._store

    def _claims_store(self, settings: Settings) -> LeaseStore:
        self._url = self.database_url or claims_database_url(settings)
        return claims_store(settings, self._url)

    @property
    def outages(self) -> Outages | None:
        """The outages this process met on the claim tables' database (None before it was
        chosen)."""
        return None if self._url is None else outages_of(sa.engine.make_url(self._url))

    @property
    def leases(self) -> RunLeases:
        if self._run_leases is None:
            raise RuntimeError("leases are only available inside a run")
        return self._run_leases

    @property
    def paths(self) -> DataPaths:
        """The data directory, once found to be the one the database serves (db/served_data.py:
        raises DataDirectoryMismatch otherwise)."""
        from pathlib import Path

        root = Path(self.data_dir) if self.data_dir else self.settings.data_dir
        require_served_data_dir(self.store.engine, root)
        return DataPaths(root)

    def host_throttle(
        self,
        run_id: str,
        options: DownloadConfig,
        *,
        check: Callable[[], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> SharedThrottle:
        """The host throttle every run shares (pauses, request turns, download slots), with the
        pause policy of `options`, for run `run_id`, whose heartbeat keeps its download slots."""
        return SharedThrottle.for_download(
            self.store.engine,
            run_id,
            options,
            stale_after_s=self.settings.lease.stale_after_s,
            check=check,
            log=log,
        )

    @property
    def catalog(self) -> Catalog:
        return self.catalog_for()

    def catalog_for(self, *, requested_stages: frozenset[str] = frozenset()) -> Catalog:
        return Catalog(self.store.engine, self.store, self.paths, requested_stages=requested_stages)


def _being_cancelled(context: dg.InitResourceContext) -> bool:
    if context.run is None or context.instance is None:
        return False
    run = context.instance.get_run_by_id(context.run.run_id)
    return run is not None and run.status in (
        dg.DagsterRunStatus.CANCELING,
        dg.DagsterRunStatus.CANCELED,
    )


def claims_store(settings: Settings, url: str | None = None) -> LeaseStore:
    """The claim tables at `url` (default: the settings' database), their schema created or
    upgraded on first use in this process (so a fresh `dagster dev` works without a separate
    `dataminer db upgrade`)."""
    from dataminer_dagster.db.migrate import ensure_schema

    engine = get_engine(url or claims_database_url(settings), lease=settings.lease)
    ensure_schema(engine)
    return LeaseStore(engine, settings.retry)
