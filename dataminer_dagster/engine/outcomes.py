"""What a stage's function gives back for an item: an `ItemResult` (done), or one of the
exceptions that say what else happened to it (engine/stage_run.py's table of outcomes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa


class Blocked(Exception):
    """A rule says skip this item (blocked hashtag, too long...): terminal, and not a failure."""


class PermanentFailure(Exception):
    """Retrying cannot help (HTTP 404, an undecodable file): the item is dead at once."""


class RequeueFirst(Exception):
    """The item needs work done again before it can run (its frames were deleted): `requeue`
    queues that work in the transaction that records this failure (the attempt counts)."""

    def __init__(self, message: str, requeue: Callable[[sa.Connection], None]):
        super().__init__(message)
        self.requeue = requeue


class Postponed(Exception):
    """Not the item's fault (a paused host): it is tried again after a back-off, or at
    `not_before` when given, and the attempt does not count, so a throttling host never turns good
    items dead. A full disk is postponed the same way without being raised as this: the stage
    machinery recognises it in any exception (core/files.py, `disk_full`)."""

    def __init__(self, message: str, not_before: datetime | None = None):
        super().__init__(message)
        self.not_before = not_before


class PastDeadline(Exception):
    """The command that asked for this run stopped waiting (`dataminer run --timeout`) while the
    item was worked on (`StageContext.check_deadline`): it is given back as it was, no attempt
    used, for a later run."""


@dataclass
class ItemResult:
    # Shown on the partition in the UI (engine/previews.py: `Preview`s and readable values).
    metadata: dict[str, Any] = field(default_factory=dict)
    outcome: dict[str, Any] | None = None  # short summary kept on the work item
    commit: Callable[[sa.Connection], None] | None = (
        None  # record + publish, inside the transaction
    )
    # What this item decided for another asset's same partition, recorded there as an observation
    # (asset name -> metadata): frames telling frames_backup that it has nothing to do.
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)
