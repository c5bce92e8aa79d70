"""What every section of a project's config shares: strict validation (an unknown key is an
error that names it), frozen values, and the few value types several sections use. Each stage
declares its own section in its folder (`assets/<stage>/config.py`); `dataminer_dagster.config`
composes them into the project config."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

SAFE_NAME = r"^[A-Za-z0-9_-]{1,64}$"


class ConfigError(ValueError):
    """A project config that cannot be used; the message names the file, the key and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
