"""The backup stage's config (`backup:` in the project YAML)."""

from __future__ import annotations

from pydantic import Field, field_validator

from dataminer_dagster.core.config_section import Section
from dataminer_dagster.core.rsync import check_dest


class BackupConfig(Section):
    dest: str = Field(
        description="Local directory outside the data directory (relative: to the config file), "
        "or [user@]host:/path (rsync over ssh, key-based)."
    )
    delete_after_backup: bool = Field(
        False,
        description="Delete raw frames after a verified backup, when no project still needs them.",
    )

    @field_validator("dest")
    @classmethod
    def _plain_destination(cls, dest: str) -> str:
        return check_dest(dest)
