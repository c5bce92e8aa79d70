"""The IO manager of the stages whose output another asset may load (`dataset`, `deduped_set`,
`detections`): it stores nothing (a stage's files are its output, published when its work item is
done) and loads, for each project partition, the typed value of `outputs.py` built from the
project's row in the claim database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from dataminer_dagster.db.reports import item_state
from dataminer_dagster.outputs import OutputMissing, StageOutput, load_output
from dataminer_dagster.registry import DETECT
from dataminer_dagster.resources.db import DatabaseResource
from dataminer_dagster.tags import STAGE_TAG


class StageOutputsIOManager(dg.IOManager):
    """Gives a project stage's output to a downstream asset: one value for an asset partitioned
    by project, a dict (project -> value) for an unpartitioned one or a range of projects."""

    def __init__(self, db: DatabaseResource):
        self.db = db

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is not None:
            raise TypeError(
                f"{context.asset_key.to_user_string()}: a stage's output is its files; "
                f"it returns nothing (got a {type(obj).__name__})"
            )

    def load_input(self, context: dg.InputContext) -> StageOutput | dict[str, StageOutput]:
        upstream = context.upstream_output
        stage = upstream.definition_metadata.get(STAGE_TAG) if upstream else None
        asset = context.asset_key.to_user_string()
        if stage is None:
            raise TypeError(f"{asset} is not a dataminer stage with a loadable output")
        if not context.has_asset_partitions:
            raise TypeError(f"{asset} is partitioned by project; its input needs partitions")
        projects = list(context.asset_partition_keys)
        db = self.db
        if context.has_partition_key and len(projects) == 1:
            return self._load(db, stage, asset, projects[0])
        found: dict[str, StageOutput] = {}
        missing = []
        for project in projects:
            try:
                found[project] = self._load(db, stage, asset, project)
            except OutputMissing as why:
                missing.append(str(why))
        if missing:
            context.log.warning(
                f"{asset}: {len(missing)} of {len(projects)} projects have no output yet "
                f"and are left out: " + "; ".join(missing[:5])
            )
        return found

    def _load(self, db: DatabaseResource, stage: str, asset: str, project: str) -> StageOutput:
        row = db.catalog.projects.get(project)
        if row is None:
            raise OutputMissing(
                f"{asset} {project}: no such project in the claim database "
                f"(register it: dataminer project add <config.yaml>)"
            )
        if stage == DETECT and row.config.detect is None:
            raise OutputMissing(f"{asset} {project}: the project has no detect section")
        try:
            return load_output(stage, project, Path(row.output_dir))
        except OutputMissing as missing:
            state = item_state(db.store.engine, stage, project)
            now = (
                f"its work item is not queued yet (the project is at its {row.stage} stage)"
                if state is None
                else f"its work item is {state.status} after {state.attempts} attempts"
                + (f" ({state.last_error})" if state.last_error else "")
            )
            raise OutputMissing(
                f"{asset} {project} has no output yet: {missing}; {now}. "
                f"Materialize {asset} for {project} first (or let the work sensor do it)."
            ) from None


@dg.io_manager(
    required_resource_keys={"db"},
    description="Loads dataset, deduped_set and detections as typed values (outputs.py) from "
    "the claim database of the `db` resource; stores nothing.",
)
def stage_outputs_io_manager(context: dg.InitResourceContext) -> StageOutputsIOManager:
    return StageOutputsIOManager(context.resources.db)
