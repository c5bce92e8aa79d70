"""The progress bars of `dataminer run` and `dataminer demo`: one per stage of the board."""

from __future__ import annotations

import time

import sqlalchemy as sa

from dataminer_dagster.assets import REGISTRY
from dataminer_dagster.db.reports import stage_counts
from dataminer_dagster.db.schema import FINISHED


class ProgressBoard:
    """One tqdm bar per stage of a project: finished items out of all known items. Without a
    terminal, a one-line summary every 15 seconds instead; not `enabled`, nothing (and no
    query)."""

    def __init__(self, engine: sa.Engine, project_id: int, *, enabled: bool = True):
        import sys

        from tqdm import tqdm

        self.engine, self.project_id = engine, project_id
        self.shown = enabled
        self.lines = enabled and not sys.stderr.isatty()
        enabled = enabled and not self.lines
        self.bars = {
            stage: tqdm(
                total=0,
                desc=f"{stage:<9}",
                unit="item",
                position=i,
                leave=True,
                disable=not enabled,
                dynamic_ncols=True,
            )
            for i, stage in enumerate(REGISTRY.board)
        }
        self._last = 0.0

    def update(self, *, force: bool = False) -> None:
        if not self.shown:
            return
        if not force and time.monotonic() - self._last < (15.0 if self.lines else 0.5):
            return
        self._last = time.monotonic()
        counts = stage_counts(self.engine, self.project_id)
        if self.lines:
            self.write(
                "progress: "
                + ", ".join(_summary(stage, counts.get(stage, {})) for stage in self.bars)
            )
            return
        for stage, bar in self.bars.items():
            statuses = counts.get(stage, {})
            total = sum(statuses.values())
            finished = sum(statuses.get(s, 0) for s in FINISHED)
            bar.total = total
            bar.n = finished
            problems = {
                s: statuses.get(s, 0) for s in ("failed", "dead", "blocked") if statuses.get(s)
            }
            bar.set_postfix(problems or {}, refresh=False)
            bar.refresh()

    def close(self) -> None:
        """Close the bars as they are (`update(force=True)` first shows the last counts)."""
        for bar in self.bars.values():
            bar.close()

    def write(self, message: str) -> None:
        from tqdm import tqdm

        tqdm.write(message)


def _summary(stage: str, statuses: dict[str, int]) -> str:
    total = sum(statuses.values())
    finished = sum(statuses.get(s, 0) for s in FINISHED)
    problems = "".join(f" {statuses[s]} {s}" for s in ("failed", "dead") if statuses.get(s))
    return f"{stage} {finished}/{total}{problems}"
