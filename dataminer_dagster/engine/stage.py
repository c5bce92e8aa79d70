"""What a stage's function `(item, ctx) -> ItemResult` gets: its item (`StageItem`) and
`StageContext` (the database, the models and download client, staging paths, the run's
deadline). The stage is declared by `@stage_asset` (engine/stage_asset.py) and run by
engine/stage_run.py."""

import copy
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from dataminer_dagster.core.files import LiveTokens, remove_leftovers, staging_path
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import Lease, LeaseLost
from dataminer_dagster.engine.outcomes import PastDeadline
from dataminer_dagster.registry import split_project_video_key
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.resources.download_client import DownloadClient
from dataminer_dagster.resources.models import ModelsResource


@dataclass(frozen=True)
class StageItem:
    lease: Lease

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def video_id(self) -> str:
        if self.lease.video_id is None:
            raise ValueError(f"{self.lease.stage} item {self.key} is not about one video")
        return self.lease.video_id

    @property
    def project(self) -> str:
        """Project name, for project and project-video stages."""
        return split_project_video_key(self.key)[0] if "." in self.key else self.key


class StageContext:
    """What a stage function may use besides its item: the Dagster context, the database, logs,
    and the staging paths it builds its outputs in (`staging_path`).

    `following`: the stages this run executes after this one (its lane's). Items the stage queues
    for them are marked requested (`catalog`), so that no other run is asked for them meanwhile
    and a run requested ahead of them keeps waiting."""

    def __init__(
        self,
        context: dg.AssetExecutionContext,
        db: DatabaseResource,
        following: Sequence[str] = (),
        deadline: float | None = None,
    ):
        self.context = context
        self.db = db
        self.log = context.log
        self.following = frozenset(following)
        # When the command that asked for this run stops waiting for it (time.time()).
        self.deadline = deadline
        self._memo: dict[Any, Any] = {}
        self._staged: list[Path] = []
        self._lease: Lease | None = None  # the item's (`for_item`)

    @property
    def catalog(self) -> Catalog:
        return self.db.catalog_for(requested_stages=self.following)

    @property
    def download_client(self) -> DownloadClient:
        """The `download_client` resource (stages that declare it in required_resource_keys)."""
        client = self.context.resources.download_client
        if not isinstance(client, DownloadClient):
            raise TypeError(f"resource download_client is a {type(client).__name__}")
        return client

    @property
    def models(self) -> ModelsResource:
        """The `models` resource (stages that declare it in required_resource_keys)."""
        models = self.context.resources.models
        if not isinstance(models, ModelsResource):
            raise TypeError(f"resource models is a {type(models).__name__}")
        return models

    def staging_path(self, final: Path) -> Path:
        """A fresh hidden sibling of `final` to build it in, named with the item's lease token.
        The leftovers of `final` whose lease is dead (an earlier attempt killed mid-way) are
        removed first; a live holder's stay (`remove_leftovers`). The stage machinery removes the
        staging path once the item is over, whatever became of it: the item's commit publishes
        it (`file_changes(conn).publish`) before that. Raises LeaseLost (or LeaseFenced) first
        when the item's lease is no longer held."""
        staged = staging_path(final, self._token(), self._live_tokens(staging=final))
        self._staged.append(staged)
        return staged

    def remove_leftovers(self, final: Path) -> None:
        """Remove what writers of `final` left behind (staging paths, outputs set aside) under
        leases that are dead now, never a live holder's, which may be publishing. Raises LeaseLost
        (or LeaseFenced) when the item's own lease is no longer held."""
        remove_leftovers(final, self._live_tokens())

    def _token(self) -> str | None:
        return None if self._lease is None else self._lease.token.hex

    def _live_tokens(self, staging: Path | None = None) -> LiveTokens | None:
        """Which leases are live, by the database, for `remove_leftovers`; it raises LeaseLost
        (or LeaseFenced) when the item's own lease is not, so that a holder that lost its lease
        touches no file. None outside an item. `staging`: the output the item is about to stage,
        recorded by the same question, so that the lease reaper finds what a worker that dies
        leaves beside it (db/file_changes.py `remove_dead_leftovers`)."""
        lease = self._lease
        if lease is None:
            return None
        self.db.leases.check(lease)
        own = lease.token.hex

        def live(tokens: Collection[str]) -> Collection[str]:
            recorded = None if staging is None else (lease, staging)
            alive = self.db.leases.live_tokens({*tokens, own}, recorded)
            if own not in alive:
                raise LeaseLost(lease)
            return alive

        return live

    def for_item(self, lease: Lease) -> "StageContext":
        """This context for the work on one item: the run's memo, the item's own staging."""
        item_context = copy.copy(self)
        item_context._staged = []
        item_context._lease = lease
        return item_context

    @property
    def staged(self) -> list[Path]:
        """The staging paths handed out by `staging_path` (of the item's context)."""
        return list(self._staged)

    def memo(self, key: Any, factory: Callable[[], Any]) -> Any:
        """Compute once per run (e.g. text embeddings of a project's prompts)."""
        if key not in self._memo:
            self._memo[key] = factory()
        return self._memo[key]

    def check_lease(self, item: StageItem) -> None:
        """Call between units of long work: raises LeaseLost when the item was taken away."""
        self.db.leases.check(item.lease)

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    def check_deadline(self) -> None:
        """Call while waiting on something slow (a download): raises PastDeadline once the
        command that asked for this run stopped waiting (`dataminer run --timeout`), so that the
        item is given back rather than finished long after."""
        if self.past_deadline():
            raise PastDeadline("past the deadline of the command that asked for this run")
