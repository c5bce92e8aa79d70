"""The pipeline as a Dagster Component, for a `dg` project's defs folder (this module is the
package's `dg` registry module: the `dagster_dg_cli.registry_modules` entry point).

    dg list components                                   # lists dataminer_dagster.components.DataminerPipeline
    dg scaffold defs dataminer_dagster.components.DataminerPipeline mining

writes `defs/mining/defs.yaml`:

    type: dataminer_dagster.components.DataminerPipeline
    attributes:
      prefix: dataminer          # asset keys dataminer/dataset, ...; jobs dataminer_project_job, ...
      group: null                # every asset in this group (default: ingest and curation)
      settings_file: null        # a dataminer settings file, relative to this folder
                                 # (default: $DATAMINER_SETTINGS)
      executor: null             # in_process, multiprocess or celery (default: $DATAMINER_EXECUTOR)

The component builds `definitions.build_definitions` with these attributes. This module stays
light (dg imports it to list components): the pipeline is imported when the defs are built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

_SCAFFOLDED = {"prefix": "dataminer", "group": None, "settings_file": None, "executor": None}


class _PipelineScaffolder(dg.Scaffolder):
    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        dg.scaffold_component(request, _SCAFFOLDED)


@dg.scaffold_with(_PipelineScaffolder)
class DataminerPipeline(dg.Component, dg.Model, dg.Resolvable):
    """The dataminer pipeline: video catalog to dataset, with its jobs, sensors and resources.

    Its eight assets, the lanes' jobs, the sensors that drive them and the resources they use,
    built by `build_definitions`. A downstream asset loads `dataset`, `deduped_set` or
    `detections` by naming it in `ins` (dataminer_dagster.outputs)."""

    prefix: str | None = Field(
        None,
        description="Put the asset keys under this prefix (dataminer/dataset) and start the "
        "names of the jobs and sensors with it (dataminer_project_job, dataminer_work).",
    )
    group: str | None = Field(
        None, description="Put every asset in this group (default: ingest and curation)."
    )
    settings_file: str | None = Field(
        None,
        description="A dataminer settings file: batches and run shares per lane, sensor "
        "intervals, retries, leases (default: $DATAMINER_SETTINGS, else "
        "$DATAMINER_HOME/settings.yaml).",
    )
    executor: Literal["in_process", "multiprocess", "celery"] | None = Field(
        None,
        description="How the pipeline's runs execute their steps (default: "
        "$DATAMINER_EXECUTOR, else in_process).",
    )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from dataminer_dagster.definitions import build_definitions

        settings = None
        if self.settings_file is not None:  # relative to the folder of this defs.yaml
            settings = context.path / Path(self.settings_file).expanduser()
        return build_definitions(
            prefix=self.prefix, group=self.group, settings=settings, executor=self.executor
        )
