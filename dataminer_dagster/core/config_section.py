"""What every section of a project's config shares: strict validation (an unknown key is an
error that names it), frozen values, and the few value types several sections use. Each stage
declares its own section in its folder (`assets/<stage>/config.py`); `dataminer_dagster.config`
composes them into the project config."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

SAFE_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class ConfigError(ValueError):
    """A project config that cannot be used; the message names the file, the key and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Keys that change how a stage runs, not what it makes (a device, a batch size): changing one
    # leaves the work done with the old value current.
    RUN_SETTINGS: ClassVar[frozenset[str]] = frozenset()

    def results_view(self) -> dict[str, Any]:
        """What of this section the output of a stage that reads it depends on (its part of the
        stage's fingerprint)."""
        return self.model_dump(mode="json", exclude=set(self.RUN_SETTINGS))


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
