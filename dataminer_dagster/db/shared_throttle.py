"""The host throttle every run shares: acquisition's `HostThrottle` on the claim database's
pauses, request turns and download slots (db/host_pauses.py). Stages get one from
`DatabaseResource.host_throttle`, commands from `SharedThrottle.for_download`."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import sqlalchemy as sa

from dataminer_dagster.acquisition.errors import Pause, ThrottleSignal
from dataminer_dagster.acquisition.politeness import HostThrottle, PausePolicy, Turn
from dataminer_dagster.db.host_pauses import (
    HostPause,
    HostTurn,
    host_turn,
    read_pause,
    release_slot,
    take_slot,
)

if TYPE_CHECKING:
    from dataminer_dagster.assets.download.config import DownloadConfig


def _pause(row: HostPause, retry_after: float | None = None) -> Pause:
    return Pause(row.host, row.until, row.remaining_s, row.kind, row.reason, retry_after)


class _SharedTurn(Turn):
    def __init__(self, throttle: SharedThrottle, turn: HostTurn):
        found = turn.found
        super().__init__(turn.key, _pause(found) if found and found.in_force else None)
        self._throttle = throttle
        self._turn = turn

    def pause(self, signal: ThrottleSignal) -> Pause:
        strikes = self._turn.found.strikes if self._turn.found else 0
        row = self._turn.pause(
            self._throttle.policy.delay(signal, strikes),
            signal.kind,
            signal.describe(),
            self._throttle.run_id,
        )
        return _pause(row, signal.retry_after)

    def succeeded(self) -> None:
        self._turn.succeeded()


class SharedThrottle(HostThrottle):
    """Pauses, turns and slots in the claim database, for run `run_id` (whose heartbeat keeps its
    download slots; a slot of a run silent for `stale_after_s` is taken over)."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        run_id: str,
        policy: PausePolicy,
        stale_after_s: float,
        max_wait_s: float = 0.0,
        check: Callable[[], None] | None = None,
        log: Callable[[str], None] | None = None,
    ):
        super().__init__(policy, max_wait_s=max_wait_s, check=check, log=log)
        self.engine = engine
        self.run_id = run_id
        self.stale_after_s = stale_after_s

    @classmethod
    def for_download(
        cls,
        engine: sa.Engine,
        run_id: str,
        options: DownloadConfig,
        *,
        stale_after_s: float,
        check: Callable[[], None] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> SharedThrottle:
        """The throttle with the pause policy and the longest wait of a download's `options`."""
        return cls(
            engine,
            run_id=run_id,
            policy=options.pauses,
            stale_after_s=stale_after_s,
            max_wait_s=options.max_pause_wait_s,
            check=check,
            log=log,
        )

    def current_pause(self, key: str) -> Pause | None:
        row = read_pause(self.engine, key)
        return _pause(row) if row is not None and row.in_force else None

    @contextmanager
    def _turn(self, key: str) -> Iterator[Turn]:
        with host_turn(self.engine, key) as turn:
            yield _SharedTurn(self, turn)

    @contextmanager
    def download_slot(self, host: str, limit: int) -> Iterator[None]:
        token = uuid.uuid4()
        delay = 0.05
        while not take_slot(self.engine, host, limit, token, self.run_id, self.stale_after_s):
            self.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 1.0)
        try:
            yield
        finally:
            release_slot(self.engine, token)
