"""The `dataminer` command: one module per group of commands. They parse arguments and print;
what they show or do lives in the package's other parts (db/, hosting/, core/).

    app.py        the group, errors a user can fix, the process's database context
    database.py   dataminer db ...
    projects.py   dataminer project add|list, add-video, refresh, populate
    running.py    dataminer run, dataminer demo
    status.py     dataminer status, dataminer project status
    admin.py      project delete, delete-videos, cleanup-orphans, retry, force-<stage>
    dev.py        dataminer dev, dataminer export
    review.py     dataminer review export|import|push|pull
    calibrate.py  dataminer calibrate export|import|push|pull|show
    services.py   dataminer services ...
    progress.py   the progress bars of `run` and `demo`
"""

from dataminer_dagster.cli import (
    admin,
    calibrate,
    database,
    dev,
    projects,
    review,
    running,
    services,
    status,
)
from dataminer_dagster.cli.app import main

__all__ = [
    "main",
    "admin",
    "calibrate",
    "database",
    "dev",
    "projects",
    "review",
    "running",
    "services",
    "status",
]
